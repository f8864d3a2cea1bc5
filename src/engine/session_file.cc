#include "engine/session_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "base/error.h"
#include "base/hash.h"

namespace ellm {
namespace {

constexpr char kMagic[8] = {'E', 'L', 'L', 'M', 'K', 'V', 'S', 'N'};
// 4: the KV cache's dtype (--kv-cache-dtype) in the header; 3: a slot's state may carry sliding
// windows of token rows (Qwen3.8-Flash-Next's n-gram module) and KV rows per-position values
// beside K and V (its indexer keys); 2: recurrent states; 1: KV.
constexpr uint32_t kVersion = 4;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t chunk_positions;
  uint64_t fingerprint, format_hash, n_ranges, row_bytes, state_bytes;
  uint64_t kv_dtype;  // KvDtype
  uint64_t n_tokens, n_snapshots;
  uint64_t tokens_hash, snapshots_hash;  // of the tokens; of the snapshot positions and checksums
  uint64_t header_hash;                  // of every field above
};

const char* kv_dtype_label(uint64_t dtype) {
  return dtype <= uint64_t(KvDtype::int8) ? kv_dtype_name(KvDtype(dtype)) : "unknown";
}

uint64_t header_hash(const Header& h) { return hash_bytes(&h, offsetof(Header, header_hash)); }
uint64_t n_chunks(uint64_t n) { return (n + kChunkPositions - 1) / kChunkPositions; }
uint64_t snapshots_offset(uint64_t n) { return sizeof(Header) + 4 * n; }
uint64_t checksums_offset(uint64_t n, uint64_t s) { return snapshots_offset(n) + 16 * s; }
uint64_t data_offset(uint64_t n, uint64_t s) { return checksums_offset(n, s) + 8 * n_chunks(n); }
uint64_t states_offset(const Header& h) {
  return data_offset(h.n_tokens, h.n_snapshots) + h.n_tokens * h.n_ranges * h.row_bytes;
}

// The pieces of chunk c: for each range, its rows of the chunk's positions.
template <class Span, class Ptr>
void chunk_pieces(std::span<const Span> ranges, uint64_t row_bytes, uint64_t chunk, uint64_t n,
                  std::vector<iovec>& out) {
  out.clear();
  const uint64_t begin = chunk * kChunkPositions, end = std::min(n, begin + kChunkPositions);
  for (const Span& range : ranges)
    out.push_back({const_cast<uint8_t*>(static_cast<Ptr>(range.data() + begin * row_bytes)),
                   size_t((end - begin) * row_bytes)});
}

uint64_t pieces_hash(const std::vector<iovec>& pieces) {
  uint64_t h = 0;
  for (const iovec& piece : pieces) h = hash_bytes(piece.iov_base, piece.iov_len, h);
  return h;
}

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(path, "write failed: " + (n < 0 ? errno_text() : std::string("no progress")));
    p += n;
    bytes -= size_t(n);
  }
}

// writev of every piece, resuming after short writes.
void write_pieces(int fd, std::vector<iovec> pieces, const std::string& path) {
  size_t first = 0;
  while (first < pieces.size()) {
    int count = int(std::min<size_t>(pieces.size() - first, IOV_MAX));
    ssize_t n = ::writev(fd, pieces.data() + first, count);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(path, "write failed: " + (n < 0 ? errno_text() : std::string("no progress")));
    size_t left = size_t(n);
    while (first < pieces.size() && left >= pieces[first].iov_len) left -= pieces[first++].iov_len;
    if (left > 0) {
      pieces[first].iov_base = static_cast<uint8_t*>(pieces[first].iov_base) + left;
      pieces[first].iov_len -= left;
    }
  }
}

bool read_exact(int fd, void* data, size_t bytes, uint64_t offset) {
  auto* p = static_cast<uint8_t*>(data);
  while (bytes > 0) {
    ssize_t n = ::pread(fd, p, bytes, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= size_t(n);
    offset += uint64_t(n);
  }
  return true;
}

bool read_pieces(int fd, std::vector<iovec> pieces, uint64_t offset) {
  size_t first = 0;
  while (first < pieces.size()) {
    int count = int(std::min<size_t>(pieces.size() - first, IOV_MAX));
    ssize_t n = ::preadv(fd, pieces.data() + first, count, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    offset += uint64_t(n);
    size_t left = size_t(n);
    while (first < pieces.size() && left >= pieces[first].iov_len) left -= pieces[first++].iov_len;
    if (left > 0) {
      pieces[first].iov_base = static_cast<uint8_t*>(pieces[first].iov_base) + left;
      pieces[first].iov_len -= left;
    }
  }
  return true;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens a file and checks its header against the identity; the header stays in `header`.
bool open_checked(const std::string& path, const KvIdentity& identity, Fd& file, Header& header,
                  uint64_t& file_bytes, std::string& why) {
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd < 0) return why = "cannot open: " + errno_text(), false;
  struct stat st {};
  if (fstat(file.fd, &st) != 0) return why = "cannot stat: " + errno_text(), false;
  file_bytes = uint64_t(st.st_size);
  // The magic and the version first: files of another version have another header.
  if (!read_exact(file.fd, &header, offsetof(Header, fingerprint), 0)) return why = "truncated header", false;
  if (std::memcmp(header.magic, kMagic, sizeof kMagic) != 0) return why = "not a session file", false;
  if (header.version != kVersion)
    return why = "written by another version (" + std::to_string(header.version) + ")", false;
  if (!read_exact(file.fd, &header, sizeof header, 0)) return why = "truncated header", false;
  if (header_hash(header) != header.header_hash) return why = "corrupt header", false;
  if (header.chunk_positions != kChunkPositions) return why = "another chunk size", false;
  if (header.fingerprint != identity.fingerprint) return why = "written for another model", false;
  if (header.kv_dtype != identity.kv_dtype)
    return why = std::string("KV cache dtype ") + kv_dtype_label(header.kv_dtype) + " in the file, " +
                 kv_dtype_label(identity.kv_dtype) + " here (--kv-cache-dtype)", false;
  if (header.format_hash != identity.format_hash || header.n_ranges != identity.n_ranges ||
      header.row_bytes != identity.row_bytes || header.state_bytes != identity.state_bytes)
    return why = "another KV format", false;
  const uint64_t n = header.n_tokens, s = header.n_snapshots;
  if (n == 0 || n > (uint64_t(1) << 32)) return why = "bad token count", false;
  if (s > n || (s > 0 && identity.state_bytes == 0)) return why = "bad snapshot count", false;
  if (file_bytes != states_offset(header) + s * identity.state_bytes)
    return why = "truncated (" + std::to_string(file_bytes) + " bytes)", false;
  return true;
}

// The snapshot table: positions, then the checksums of their states.
bool read_snapshot_table(int fd, const Header& header, std::vector<int64_t>& positions,
                         std::vector<uint64_t>& checksums, std::string& why) {
  positions.resize(header.n_snapshots);
  checksums.resize(header.n_snapshots);
  const uint64_t at = snapshots_offset(header.n_tokens);
  if (!read_exact(fd, positions.data(), positions.size() * 8, at) ||
      !read_exact(fd, checksums.data(), checksums.size() * 8, at + 8 * header.n_snapshots))
    return why = "truncated snapshot table", false;
  uint64_t h = hash_bytes(positions.data(), positions.size() * 8);
  h = hash_bytes(checksums.data(), checksums.size() * 8, h);
  if (h != header.snapshots_hash) return why = "corrupt snapshot table", false;
  for (size_t i = 0; i < positions.size(); ++i)
    if (positions[i] <= 0 || uint64_t(positions[i]) > header.n_tokens || (i > 0 && positions[i] <= positions[i - 1]))
      return why = "bad snapshot position", false;
  return true;
}

}  // namespace

std::string session_file_name(const KvIdentity& identity, std::span<const int32_t> tokens,
                              std::span<const StateSnapshot> snapshots) {
  uint64_t h = hash_bytes(&identity.fingerprint, 8, identity.format_hash);
  h = hash_bytes(tokens.data(), tokens.size_bytes(), h);
  for (const StateSnapshot& snapshot : snapshots) h = hash_bytes(&snapshot.position, 8, h);
  char name[40];
  std::snprintf(name, sizeof name, "%016llx.kv", static_cast<unsigned long long>(h));
  return name;
}

void write_session_file(const std::string& dir, const std::string& name, const KvIdentity& identity,
                        std::span<const int32_t> tokens, std::span<const std::span<const uint8_t>> ranges,
                        std::span<const StateSnapshot> snapshots) {
  const uint64_t n = tokens.size();
  if (ranges.size() != identity.n_ranges) fail("session file", "KV ranges do not match the model");
  for (const auto& range : ranges)
    if (range.size() < n * identity.row_bytes) fail("session file", "a KV range is shorter than the session");
  std::vector<int64_t> positions;
  std::vector<uint64_t> state_checksums;
  for (const StateSnapshot& snapshot : snapshots) {
    if (!snapshot.state || identity.state_bytes == 0 || snapshot.position <= 0 || uint64_t(snapshot.position) > n ||
        (!positions.empty() && snapshot.position <= positions.back()))
      fail("session file", "a snapshot does not fit the session");
    positions.push_back(snapshot.position);
    state_checksums.push_back(hash_bytes(snapshot.state.get(), identity.state_bytes));
  }

  Header header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.version = kVersion;
  header.chunk_positions = kChunkPositions;
  header.fingerprint = identity.fingerprint;
  header.format_hash = identity.format_hash;
  header.kv_dtype = identity.kv_dtype;
  header.n_ranges = identity.n_ranges;
  header.row_bytes = identity.row_bytes;
  header.state_bytes = identity.state_bytes;
  header.n_tokens = n;
  header.n_snapshots = positions.size();
  header.tokens_hash = hash_bytes(tokens.data(), tokens.size_bytes());
  header.snapshots_hash = hash_bytes(state_checksums.data(), state_checksums.size() * 8,
                                     hash_bytes(positions.data(), positions.size() * 8));
  header.header_hash = header_hash(header);

  std::vector<uint64_t> checksums(n_chunks(n));
  std::vector<iovec> pieces;
  for (uint64_t c = 0; c < checksums.size(); ++c) {
    chunk_pieces<std::span<const uint8_t>, const uint8_t*>(ranges, identity.row_bytes, c, n, pieces);
    checksums[c] = pieces_hash(pieces);
  }

  static std::atomic<uint64_t> counter{0};
  std::random_device random;
  const std::string tmp = dir + "/.tmp-" + std::to_string(getpid()) + "-" +
                          std::to_string(random()) + "-" + std::to_string(counter++);
  const std::string path = dir + "/" + name;
  Fd file;
  file.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (file.fd < 0) fail(path, "cannot create a temporary file: " + errno_text());
  try {
    write_all(file.fd, &header, sizeof header, path);
    write_all(file.fd, tokens.data(), tokens.size_bytes(), path);
    write_all(file.fd, positions.data(), positions.size() * 8, path);
    write_all(file.fd, state_checksums.data(), state_checksums.size() * 8, path);
    write_all(file.fd, checksums.data(), checksums.size() * 8, path);
    for (uint64_t c = 0; c < checksums.size(); ++c) {
      chunk_pieces<std::span<const uint8_t>, const uint8_t*>(ranges, identity.row_bytes, c, n, pieces);
      write_pieces(file.fd, pieces, path);
    }
    for (const StateSnapshot& snapshot : snapshots) write_all(file.fd, snapshot.state.get(), identity.state_bytes, path);
    if (::fsync(file.fd) != 0) fail(path, "fsync failed: " + errno_text());
    ::close(file.fd);
    file.fd = -1;
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail(path, "rename failed: " + errno_text());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // The rename is durable once the directory is synced too.
  Fd directory;
  directory.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (directory.fd >= 0) ::fsync(directory.fd);
}

std::optional<SessionFileInfo> read_session_info(const std::string& path, const KvIdentity& identity,
                                                 std::string& why) {
  Fd file;
  Header header{};
  SessionFileInfo info;
  if (!open_checked(path, identity, file, header, info.file_bytes, why)) return std::nullopt;
  info.tokens.resize(header.n_tokens);
  if (!read_exact(file.fd, info.tokens.data(), info.tokens.size() * 4, sizeof header))
    return why = "truncated tokens", std::nullopt;
  if (hash_bytes(info.tokens.data(), info.tokens.size() * 4) != header.tokens_hash)
    return why = "corrupt tokens", std::nullopt;
  std::vector<uint64_t> checksums;
  if (!read_snapshot_table(file.fd, header, info.snapshots, checksums, why)) return std::nullopt;
  return info;
}

bool read_session_kv(const std::string& path, const KvIdentity& identity, int64_t end,
                     std::span<const std::span<uint8_t>> dst, std::string& why) {
  Fd file;
  Header header{};
  uint64_t file_bytes = 0;
  if (!open_checked(path, identity, file, header, file_bytes, why)) return false;
  const uint64_t n = header.n_tokens;
  if (end <= 0 || uint64_t(end) > n || (uint64_t(end) != n && end % kChunkPositions != 0))
    return why = "bad restore length " + std::to_string(end), false;
  if (dst.size() != identity.n_ranges) return why = "KV ranges do not match", false;
  const uint64_t chunks = n_chunks(uint64_t(end));
  std::vector<uint64_t> checksums(chunks);
  if (!read_exact(file.fd, checksums.data(), chunks * 8, checksums_offset(n, header.n_snapshots)))
    return why = "truncated checksums", false;
  uint64_t offset = data_offset(n, header.n_snapshots);
  std::vector<iovec> pieces;
  for (uint64_t c = 0; c < chunks; ++c) {
    chunk_pieces<std::span<uint8_t>, uint8_t*>(dst, identity.row_bytes, c, n, pieces);
    uint64_t bytes = 0;
    for (const iovec& piece : pieces) bytes += piece.iov_len;
    if (!read_pieces(file.fd, pieces, offset)) return why = "truncated KV", false;
    if (pieces_hash(pieces) != checksums[c]) return why = "corrupt KV (checksum of chunk " + std::to_string(c) + ")", false;
    offset += bytes;
  }
  return true;
}

bool read_session_state(const std::string& path, const KvIdentity& identity, int64_t position,
                        uint8_t* dst, std::string& why) {
  Fd file;
  Header header{};
  uint64_t file_bytes = 0;
  if (!open_checked(path, identity, file, header, file_bytes, why)) return false;
  std::vector<int64_t> positions;
  std::vector<uint64_t> checksums;
  if (!read_snapshot_table(file.fd, header, positions, checksums, why)) return false;
  auto at = std::find(positions.begin(), positions.end(), position);
  if (at == positions.end()) return why = "no snapshot at position " + std::to_string(position), false;
  const uint64_t i = uint64_t(at - positions.begin());
  if (!read_exact(file.fd, dst, identity.state_bytes, states_offset(header) + i * identity.state_bytes))
    return why = "truncated state", false;
  if (hash_bytes(dst, identity.state_bytes) != checksums[i])
    return why = "corrupt state (checksum of the snapshot at " + std::to_string(position) + ")", false;
  return true;
}

}  // namespace ellm
