#include "base/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"

namespace ellm {

namespace {

// While a SharedHugePagesScope lives, buffers from kSharedFrom bytes up to a huge page (a MoE's
// expert matrices: 1.6 MiB each for Qwen3.8-Flash-Next's down projections) are carved from
// shared chunks of huge pages. Each on its own sat in 4 KiB pages, and a decode step, which reads
// a new handful of experts each time, ran them at half the speed of the larger matrices beside
// them (TLB misses; the hardware prefetch stops at each 4 KiB page). A chunk is freed with its
// last buffer; the space of a buffer freed before then is not reused, hence the scope.
constexpr size_t kSharedFrom = size_t(256) << 10, kSharedChunk = size_t(64) << 20, kSharedAlign = 4096;
struct SharedChunk {
  char* base;
  size_t used;
  int64_t live;
};
struct SharedChunks {
  std::mutex mutex;
  std::vector<SharedChunk> chunks;
};
// Never destroyed: a static Buffer elsewhere may be freed after this file's statics are gone.
SharedChunks& shared() {
  static SharedChunks* chunks = new SharedChunks;
  return *chunks;
}
std::atomic<int> shared_scopes{0};

void* shared_huge_alloc(size_t bytes) {
  const size_t rounded = (bytes + kSharedAlign - 1) / kSharedAlign * kSharedAlign;
  SharedChunks& s = shared();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.chunks.empty() || s.chunks.back().used + rounded > kSharedChunk) {
    void* base = std::aligned_alloc(VirtualRegion::kHugePage, kSharedChunk);
    if (!base) throw Error("out of memory allocating " + std::to_string(kSharedChunk) + " bytes");
    madvise(base, kSharedChunk, MADV_HUGEPAGE);
    s.chunks.push_back({static_cast<char*>(base), 0, 0});
  }
  SharedChunk& chunk = s.chunks.back();
  void* p = chunk.base + chunk.used;
  chunk.used += rounded;
  ++chunk.live;
  std::memset(p, 0, bytes);
  return p;
}

// Whether p was carved from a shared chunk (and is now released).
bool shared_huge_free(void* p) {
  SharedChunks& s = shared();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    SharedChunk& chunk = s.chunks[i];
    if (static_cast<char*>(p) < chunk.base || static_cast<char*>(p) >= chunk.base + kSharedChunk) continue;
    if (--chunk.live == 0) {
      std::free(chunk.base);
      s.chunks.erase(s.chunks.begin() + int64_t(i));
    }
    return true;
  }
  return false;
}

}  // namespace

SharedHugePagesScope::SharedHugePagesScope() { ++shared_scopes; }
SharedHugePagesScope::~SharedHugePagesScope() { --shared_scopes; }

void FreeDeleter::operator()(void* p) const {
  if (p && !shared_huge_free(p)) std::free(p);
}

void* aligned_alloc_zeroed(size_t bytes) {
  if (bytes >= kSharedFrom && bytes < VirtualRegion::kHugePage && shared_scopes.load() > 0)
    return shared_huge_alloc(bytes);
  size_t align = bytes >= VirtualRegion::kHugePage ? VirtualRegion::kHugePage : kAlign;
  size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded ? rounded : align);
  if (!p) throw Error("out of memory allocating " + std::to_string(bytes) + " bytes");
  if (align == VirtualRegion::kHugePage) madvise(p, rounded, MADV_HUGEPAGE);
  std::memset(p, 0, rounded);
  return p;
}

VirtualRegion::VirtualRegion(size_t bytes, bool huge_pages) : size_(bytes) {
  if (bytes == 0) return;
  size_t slack = huge_pages ? kHugePage : 0;  // room to move the start to a 2 MiB boundary
  void* p = mmap(nullptr, bytes + slack, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw Error("cannot reserve " + std::to_string(bytes >> 20) + " MiB of address space");
  uint8_t* start = static_cast<uint8_t*>(p);
  if (huge_pages) {
    uint8_t* aligned = reinterpret_cast<uint8_t*>(
        (reinterpret_cast<uintptr_t>(start) + kHugePage - 1) / kHugePage * kHugePage);
    if (aligned > start) munmap(start, size_t(aligned - start));
    if (size_t tail = size_t(start + slack - aligned)) munmap(aligned + bytes, tail);
    start = aligned;
    madvise(start, bytes, MADV_HUGEPAGE);
  }
  data_ = start;
}

VirtualRegion::~VirtualRegion() {
  if (data_) munmap(data_, size_);
}

VirtualRegion::VirtualRegion(VirtualRegion&& o) noexcept : data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

VirtualRegion& VirtualRegion::operator=(VirtualRegion&& o) noexcept {
  if (this != &o) {
    if (data_) munmap(data_, size_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void VirtualRegion::release(size_t offset, size_t bytes) {
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  size_t begin = (offset + page - 1) / page * page;
  size_t end = std::min(size_, offset + bytes) / page * page;
  if (end > begin) madvise(data_ + begin, end - begin, MADV_DONTNEED);
}

void VirtualRegion::commit(size_t offset, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  static std::atomic<bool> unsupported{false};
  if (unsupported.load(std::memory_order_relaxed)) return;
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  size_t begin = offset / page * page;
  size_t end = std::min(size_, (offset + bytes + page - 1) / page * page);
  if (end > begin && madvise(data_ + begin, end - begin, MADV_POPULATE_WRITE) != 0 &&
      errno == EINVAL)
    unsupported.store(true, std::memory_order_relaxed);
#endif
}

size_t VirtualRegion::resident_bytes() const {
  if (!data_) return 0;
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  size_t pages = (size_ + page - 1) / page, resident = 0;
  std::vector<unsigned char> vec(std::min<size_t>(pages, 1 << 20));
  for (size_t first = 0; first < pages; first += vec.size()) {
    size_t n = std::min(vec.size(), pages - first);
    if (mincore(data_ + first * page, n * page, vec.data()) != 0) break;
    for (size_t i = 0; i < n; ++i) resident += vec[i] & 1;
  }
  return resident * page;
}

namespace {
size_t meminfo_kb(const char* key) {
  std::ifstream f("/proc/meminfo");
  std::string k;
  size_t v;
  std::string unit;
  while (f >> k >> v >> unit)
    if (k == key) return v * 1024;
  return 0;
}
}  // namespace

size_t process_resident_bytes() {
  std::ifstream f("/proc/self/statm");
  size_t total = 0, resident = 0;
  f >> total >> resident;
  return resident * size_t(sysconf(_SC_PAGESIZE));
}

size_t physical_memory_bytes() { return meminfo_kb("MemTotal:"); }
size_t available_memory_bytes() { return meminfo_kb("MemAvailable:"); }

size_t usable_memory_bytes() {
  size_t usable = available_memory_bytes();
  // A container's cgroup (v2) limit is what the OOM killer enforces, whatever the host has free.
  std::ifstream max_file("/sys/fs/cgroup/memory.max"), current_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  size_t current = 0;
  if (max_file >> max_text && max_text != "max" && current_file >> current) {
    const size_t limit = std::stoull(max_text);
    usable = std::min(usable, limit > current ? limit - current : 0);
  }
  return usable;
}

}  // namespace ellm
