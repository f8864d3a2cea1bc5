#pragma once
// The session store (docs/design.md): token sequences with their KV, kept after they leave
// the slots. Sessions live warm in RAM (a copy of their KV rows) and, with a directory, cold on
// disk (engine/session_file.h), which survives restarts and may be shared by replicas. The
// scheduler copies a session out of a slot it needs (put) and copies the best stored prefix of
// a new prompt into the slot it gives that prompt (find, plan_restore, restore).
//
// A hybrid model's session also holds snapshots of its recurrent state (engine/snapshot.h),
// and resumes only at one of them: there its KV rows and that snapshot are copied in.
//
// Matching: every session is indexed by the chained hashes of its 64-token blocks, so the
// longest stored prefix of a prompt is found by walking the prompt's blocks (a prefix tree at
// block granularity), then comparing tokens exactly. A session that another extends is dropped
// when the longer one is stored (its snapshots go with the longer one).
//
// Budgets count KV and snapshot bytes. RAM sessions are written through to disk on a writer
// thread when there is a directory; beyond the memory budget the least recently used leave RAM
// (or, without a directory, are dropped); files beyond the disk budget are deleted. A failed
// write drops the session and is counted; serving goes on.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/session_file.h"
#include "engine/snapshot.h"

namespace ellm {

struct SessionStoreOptions {
  KvIdentity identity;
  size_t memory_bytes = 0;  // RAM tier budget
  std::string dir;          // disk tier; empty = none
  size_t disk_bytes = 0;    // disk tier budget
  int64_t snapshot_interval = 4096;  // thin_snapshots' spacing of the snapshots a session keeps
};

enum class SessionTier { hot, ram, disk };
const char* tier_name(SessionTier tier);

struct SessionTierMetrics {
  int64_t hits = 0, tokens = 0;         // restores and the prompt tokens they served
  int64_t bytes_in = 0, bytes_out = 0;  // KV and snapshots copied into slots / into this tier
  double restore_seconds = 0;
  int64_t evictions = 0;                // sessions dropped from this tier by its budget
  int64_t failures = 0;                 // failed writes or restores (the session is dropped)
  int64_t sessions = 0, bytes = 0;      // held now
  // Snapshots of a hybrid model's state: taken into this tier (hot: taken by passes),
  // restored from it into slots, and pushed out of it; their bytes; held now.
  int64_t snapshots_taken = 0, snapshot_bytes_taken = 0;
  int64_t snapshots_restored = 0, snapshot_bytes_restored = 0;
  int64_t snapshots_evicted = 0, snapshot_bytes_evicted = 0;
  int64_t snapshots = 0;
};

struct SessionMetrics {
  SessionTierMetrics hot, ram, disk;
};

struct SessionInfo {
  std::string id;
  SessionTier tier;
  int64_t tokens = 0, bytes = 0, snapshots = 0;
  double idle_seconds = 0;
};

struct StoredMatch {
  uint64_t id = 0;
  int64_t tokens = 0;  // positions to restore: the common prefix, or a hybrid's furthest snapshot in it
  int64_t common = 0;  // the prefix the session shares with the prompt
  SessionTier tier = SessionTier::ram;
  bool whole = false;  // the prompt extends the whole session: its snapshots belong to the new one
};

// What a restore reads, made by plan_restore under the store's lock, so that the copy itself
// (restore) may run on another thread.
struct RestorePlan {
  StoredMatch match;
  int64_t end = 0;                    // KV positions written: a disk restore reads whole chunks
  std::shared_ptr<uint8_t[]> ram;     // the RAM copy of the KV (null: from disk)
  int64_t ram_tokens = 0;             // positions in it
  std::string path;                   // the file, when from disk
  std::vector<StateSnapshot> snapshots;  // the one at match.tokens first, then those inherited
};

class SessionStore {
 public:
  static constexpr int64_t kBlock = 64;  // sessions shorter than a block are not kept

  explicit SessionStore(SessionStoreOptions options);  // scans the directory
  ~SessionStore();                                     // stops the writer (no flush)

  // The stored session sharing the longest resumable prefix with prompt, at most max_tokens.
  StoredMatch find(std::span<const int32_t> prompt, int64_t max_tokens);
  // What restoring `match` takes; end == 0 when the session is gone. capacity bounds the
  // positions a disk restore may write.
  RestorePlan plan_restore(const StoredMatch& match, int64_t capacity);
  // Copies the planned KV into `kv` (the slot's ranges for positions [0, plan.end)) and the
  // snapshot at match.tokens into `state` (the slot's state ranges); any thread. Returns the
  // positions restored: match.tokens, or 0 when the session is gone or its file fails its
  // checks (then it is dropped). `inherited` receives the session's snapshots when the prompt
  // extends it whole.
  int64_t restore(const RestorePlan& plan, std::span<const std::span<uint8_t>> kv,
                  std::span<const std::span<uint8_t>> state, std::vector<StateSnapshot>& inherited);
  // Keeps a copy of a session whose KV is `ranges` (n_ranges spans of tokens.size() rows), with
  // its snapshots (sorted, states in memory). Nothing is copied when a stored session already
  // holds these tokens (or more).
  void put(std::span<const int32_t> tokens, std::span<const std::span<const uint8_t>> ranges,
           std::vector<StateSnapshot> snapshots = {});
  // Writes every RAM session not yet on disk, until the deadline (shutdown).
  void flush(std::chrono::steady_clock::time_point deadline);

  std::vector<SessionInfo> list();
  int64_t drop_all();  // RAM copies and this store's files; returns the sessions dropped
  SessionMetrics metrics();
  // Hot hits and snapshots are counted here too, so the metrics have one home.
  void count_hot_hit(int64_t tokens, int64_t bytes, double seconds);
  void count_hot_snapshots(int64_t taken, int64_t restored, int64_t evicted);

 private:
  struct Entry {
    uint64_t id = 0;
    std::vector<int32_t> tokens;
    std::vector<uint64_t> blocks;       // chained hash of each whole block
    std::vector<StateSnapshot> snapshots;  // states in memory while the KV is
    std::shared_ptr<uint8_t[]> ram;     // [n_ranges][tokens][row_bytes]; null when not in RAM
    std::string file;                   // file name in dir; empty when not on disk
    uint64_t file_bytes = 0;
    uint64_t last_used = 0;             // store clock: LRU order
    std::chrono::steady_clock::time_point used_at;
    bool queued = false;                // waiting for the writer
    bool leave_ram = false;             // out of the RAM budget: its RAM copy goes once written
  };

  bool hybrid() const { return options_.identity.state_bytes > 0; }
  uint64_t snapshot_bytes(const Entry& e) const { return e.snapshots.size() * options_.identity.state_bytes; }
  uint64_t entry_bytes(const Entry& e) const {
    return e.tokens.size() * options_.identity.bytes_per_token() + snapshot_bytes(e);
  }
  // Where a session can resume a prompt sharing `common` tokens with it: common itself, or for a
  // hybrid model its furthest snapshot within them.
  int64_t resumable(const Entry& e, int64_t common) const;
  std::vector<uint64_t> block_hashes(std::span<const int32_t> tokens) const;
  Entry* insert(std::vector<int32_t> tokens, std::vector<StateSnapshot> snapshots);
  void erase(uint64_t id, bool delete_file);
  void drop_ram(Entry& e);
  void queue_write(Entry& e);
  void make_ram_room(uint64_t bytes, std::unique_lock<std::mutex>& lock);
  void enforce_disk_budget();
  void rescan_locked();
  void writer_loop();
  void fail_restore(uint64_t id, const std::string& path, const std::string& why);
  std::vector<std::span<const uint8_t>> ram_ranges(const Entry& e, const uint8_t* blob) const;
  void count_evicted(SessionTierMetrics& tier, const Entry& e);

  const SessionStoreOptions options_;
  std::mutex mutex_;
  std::condition_variable writer_wake_, written_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::unordered_map<uint64_t, std::vector<uint64_t>> index_;  // block hash -> entry ids
  std::unordered_map<std::string, uint64_t> files_;            // file name -> entry id
  std::deque<uint64_t> write_queue_;
  uint64_t next_id_ = 1, clock_ = 0;
  uint64_t ram_bytes_ = 0, disk_bytes_ = 0, leaving_bytes_ = 0;  // leaving: RAM of leave_ram entries
  int writing_ = 0;                                            // writes in flight
  std::unordered_map<std::string, bool> bad_files_;            // skipped once, never re-read
  int64_t dir_mtime_ns_ = -1;
  bool stopping_ = false;
  SessionMetrics metrics_;
  std::thread writer_;
};

}  // namespace ellm
