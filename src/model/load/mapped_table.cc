#include "model/load/mapped_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "model/load/safetensors.h"

namespace ellm {
namespace {

size_t page_size() {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return page;
}

uintptr_t page_of(const void* p) { return reinterpret_cast<uintptr_t>(p) / page_size() * page_size(); }

// [first page, end of the last page) around [data, data + bytes).
std::pair<uintptr_t, uintptr_t> pages_around(const uint8_t* data, size_t bytes) {
  const uintptr_t begin = page_of(data);
  const uintptr_t end = page_of(data + bytes + page_size() - 1);
  return {begin, end};
}

std::string memlock_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "unknown";
  return limit.rlim_cur == RLIM_INFINITY ? "unlimited" : format_bytes(double(limit.rlim_cur));
}

}  // namespace

void MappedTable::add(const uint8_t* data, size_t bytes, const MappedFile& file) {
  if (bytes == 0) return;
  pieces_.push_back({data, bytes, file.path(), size_t(data - file.data())});
  bytes_ += bytes;
  // Only the pages wholly inside the piece: a neighbouring tensor keeps its read-around.
  const uintptr_t begin = page_of(data + page_size() - 1), end = page_of(data + bytes);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_RANDOM);
}

void MappedTable::lock() {
  for (const Piece& p : pieces_) {
    const auto [begin, end] = pages_around(p.data, p.bytes);
    if (mlock(reinterpret_cast<void*>(begin), end - begin) != 0)
      fail(p.path, "--mlock-table: pinning the " + format_bytes(double(bytes_)) + " n-gram table failed (" +
                       std::strerror(errno) + "; locked-memory limit " + memlock_limit() +
                       "): raise it (ulimit -l unlimited, or LimitMEMLOCK=infinity in a systemd unit), "
                       "or leave the flag out");
  }
  locked_ = true;
}

void MappedTable::read_ahead(const uint8_t* const* rows, size_t count, size_t row_bytes,
                             uintptr_t* scratch) const {
  if (locked_ || count == 0) return;
  size_t n = 0;
  for (size_t i = 0; i < count; ++i) {
    scratch[n++] = page_of(rows[i]);
    scratch[n++] = page_of(rows[i] + row_bytes - 1);
  }
  std::sort(scratch, scratch + n);
  n = size_t(std::unique(scratch, scratch + n) - scratch);
  // Runs of adjacent pages in one call.
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && scratch[j] == scratch[j - 1] + page_size()) ++j;
    madvise(reinterpret_cast<void*>(scratch[i]), (j - i) * page_size(), MADV_WILLNEED);
    i = j;
  }
}

void MappedTable::count_gather(uint64_t tokens, uint64_t major, uint64_t minor) const {
  tokens_.fetch_add(tokens, std::memory_order_relaxed);
  major_.fetch_add(major, std::memory_order_relaxed);
  minor_.fetch_add(minor, std::memory_order_relaxed);
}

MappedTableStatus MappedTable::status() const {
  MappedTableStatus s;
  s.bytes = bytes_;
  s.locked = locked_;
  s.gathered_tokens = tokens_.load(std::memory_order_relaxed);
  s.major_faults = major_.load(std::memory_order_relaxed);
  s.minor_faults = minor_.load(std::memory_order_relaxed);
  constexpr size_t kChunkPages = size_t(1) << 18;  // 1 GiB of 4 KiB pages per call
  std::vector<unsigned char> resident(kChunkPages);
  size_t pages = 0;
  for (const Piece& p : pieces_) {
    const auto [begin, end] = pages_around(p.data, p.bytes);
    for (uintptr_t at = begin; at < end;) {
      const size_t n = std::min(kChunkPages, (end - at) / page_size());
      if (mincore(reinterpret_cast<void*>(at), n * page_size(), resident.data()) == 0)
        for (size_t i = 0; i < n; ++i) pages += resident[i] & 1;
      at += n * page_size();
    }
  }
  s.resident_bytes = std::min(bytes_, pages * page_size());
  return s;
}

void MappedTable::evict() const {
  if (locked_) return;
  for (const Piece& p : pieces_) {
    const uintptr_t begin = page_of(p.data + page_size() - 1), end = page_of(p.data + p.bytes);
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
    const int fd = ::open(p.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    posix_fadvise(fd, off_t(p.file_offset), off_t(p.bytes), POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

FaultCounter::FaultCounter() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  major_ = u.ru_majflt;
  minor_ = u.ru_minflt;
}

void FaultCounter::add_to(const MappedTable& table, uint64_t tokens) const {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  table.count_gather(tokens, uint64_t(u.ru_majflt - major_), uint64_t(u.ru_minflt - minor_));
}

}  // namespace ellm
