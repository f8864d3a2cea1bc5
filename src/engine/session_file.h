#pragma once
// A session on disk: its tokens, the KV of every position and, for a hybrid model, snapshots of
// its recurrent state, in one file that checks itself (version 4; files of earlier versions are
// skipped with a log line).
//   header      magic, version, model fingerprint, KV format hash, shape, KV dtype, counts, hashes
//   tokens      int32 [n_tokens]
//   snapshots   int64 [n_snapshots] positions, then uint64 [n_snapshots] checksums of their states
//   checksums   uint64 [n_chunks]        one per chunk of kChunkPositions positions
//   chunks      for each chunk: for each KV range, the rows of the chunk's positions
//   states      [n_snapshots][state_bytes]
// Chunks are position-major, so restoring a prefix reads the front of the file, sequentially,
// then one state, and checks exactly the bytes it read. Files are written to a temporary name,
// synced, then renamed: a reader sees a whole file or none, even with several servers on one
// directory.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/snapshot.h"
#include "kernels/kv_dtype.h"

namespace ellm {

constexpr int64_t kChunkPositions = 256;

// What must match for KV to be restored: the model, the meaning of a row, the row shape.
struct KvIdentity {
  uint64_t fingerprint = 0;   // Model::fingerprint()
  uint64_t format_hash = 0;   // hash of Model::kv_format()
  uint64_t n_ranges = 0;      // byte ranges per position (layers x K/V)
  uint64_t row_bytes = 0;     // bytes of one position in one range
  uint64_t state_bytes = 0;   // of one snapshot of the recurrent state (0: the model has none)
  uint64_t kv_dtype = 0;      // KvDtype (kernels/kv_dtype.h): named in the log when it differs
  uint64_t bytes_per_token() const { return n_ranges * row_bytes; }
  bool operator==(const KvIdentity&) const = default;
};

struct SessionFileInfo {
  std::vector<int32_t> tokens;
  std::vector<int64_t> snapshots;  // positions
  uint64_t file_bytes = 0;
};

// The file name a session gets (content-addressed: same model, tokens and snapshots, same name).
std::string session_file_name(const KvIdentity& identity, std::span<const int32_t> tokens,
                              std::span<const StateSnapshot> snapshots);

// Writes a session whose KV is `ranges` (n_ranges spans of tokens.size() rows each), with its
// snapshots (their states in memory), to dir/name atomically. Throws Error (the temporary file
// removed) when it cannot.
void write_session_file(const std::string& dir, const std::string& name, const KvIdentity& identity,
                        std::span<const int32_t> tokens, std::span<const std::span<const uint8_t>> ranges,
                        std::span<const StateSnapshot> snapshots);

// Reads and checks a file's header and tokens. nullopt with `why` set when the file is not a
// session of this identity (truncated, corrupt, another model or version).
std::optional<SessionFileInfo> read_session_info(const std::string& path, const KvIdentity& identity,
                                                 std::string& why);

// Reads the KV of positions [0, end) of the file's session into dst (n_ranges spans of at
// least `end` rows), whole chunks at a time: end must be a multiple of kChunkPositions or the
// session's length. Checks every chunk it read. Returns false, with `why`, on any failure.
bool read_session_kv(const std::string& path, const KvIdentity& identity, int64_t end,
                     std::span<const std::span<uint8_t>> dst, std::string& why);

// Reads the snapshot at `position` into dst (state_bytes) and checks it.
bool read_session_state(const std::string& path, const KvIdentity& identity, int64_t position,
                        uint8_t* dst, std::string& why);

}  // namespace ellm
