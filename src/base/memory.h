#pragma once
// Memory: aligned buffers for activations and packed weights, and virtual reservations whose
// pages commit only when written (the KV cache).
#include <cstddef>
#include <cstdint>
#include <memory>

namespace ellm {

constexpr size_t kAlign = 64;

struct FreeDeleter {
  void operator()(void* p) const;
};

// Zero-filled, kAlign-aligned; large buffers ask for transparent huge pages.
void* aligned_alloc_zeroed(size_t bytes);

// While one lives (a model's load), buffers of 256 KiB up to 2 MiB share chunks of transparent
// huge pages: buffers that live as long as the model, such as a MoE's experts.
class SharedHugePagesScope {
 public:
  SharedHugePagesScope();
  ~SharedHugePagesScope();
  SharedHugePagesScope(const SharedHugePagesScope&) = delete;
  SharedHugePagesScope& operator=(const SharedHugePagesScope&) = delete;
};

template <class T>
using Buffer = std::unique_ptr<T[], FreeDeleter>;

template <class T>
Buffer<T> make_buffer(size_t count) {
  return Buffer<T>(static_cast<T*>(aligned_alloc_zeroed(count * sizeof(T) + kAlign)));
}

// An address range reserved, not committed: reading it gives zeros, writing commits pages.
class VirtualRegion {
 public:
  VirtualRegion() = default;
  // Throws Error when the reservation fails. With huge_pages the range starts on a 2 MiB
  // boundary and asks for transparent huge pages: pages then commit 2 MiB at a time, which
  // costs far less per byte than 4 KiB faults (above all in a VM) and spares TLB misses.
  explicit VirtualRegion(size_t bytes, bool huge_pages = false);
  ~VirtualRegion();
  VirtualRegion(VirtualRegion&& o) noexcept;
  VirtualRegion& operator=(VirtualRegion&& o) noexcept;
  VirtualRegion(const VirtualRegion&) = delete;
  VirtualRegion& operator=(const VirtualRegion&) = delete;

  static constexpr size_t kHugePage = size_t(2) << 20;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Gives the pages fully inside [offset, offset+bytes) back to the OS; they read as zero after.
  void release(size_t offset, size_t bytes);
  // Faults in the pages of [offset, offset + bytes) for writing with one system call (a page
  // fault per 4 KiB costs far more, above all in a VM). Best effort: on kernels without
  // MADV_POPULATE_WRITE the pages simply fault in when written.
  void commit(size_t offset, size_t bytes);
  size_t resident_bytes() const;  // pages of this region currently in RAM (mincore)

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

size_t process_resident_bytes();  // VmRSS of this process
size_t physical_memory_bytes();   // MemTotal
size_t available_memory_bytes();  // MemAvailable
size_t usable_memory_bytes();     // MemAvailable, or less under a container's cgroup limit

}  // namespace ellm
