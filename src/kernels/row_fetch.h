#pragma once
// Software prefetch of a block of cache rows in memory order, a few lines at a time, for the
// decode attention kernels (simd_attention_decode.h; _mm_prefetch is SSE).
//
// Why memory order: the decode kernels read one head's part of each row at a time (256 bytes of
// every 2 KiB for Qwen3-0.6B), but the lines they fetch ahead are whole rows, front to back.
// Fetched in the kernels' own head order, the fetches jump back and forth within rows, which
// the memory system serves worse than one forward stream.
// Into L2 (T1), not L1: lines fetched half a block ahead overflow L1 before use, so fetching
// them into L1 only evicts lines still needed.
#include <xmmintrin.h>

#include <cstdint>

namespace ellm {

class RowFetch {
 public:
  RowFetch() = default;  // nothing to fetch
  // Rows [row0, row0 + rows) x elements [0, width) of the rows `ld` elements apart at `base`
  // (FP16, BF16 or FP8 codes); nothing when rows <= 0.
  template <class E>
  RowFetch(const E* base, int64_t row0, int64_t rows, int64_t ld, int64_t width)
      : row_(rows > 0 ? reinterpret_cast<const char*>(base + row0 * ld) : nullptr),
        width_(width * int64_t(sizeof(E))), stride_(ld * int64_t(sizeof(E))), rows_left_(rows) {}

  bool active() const { return row_ != nullptr; }

  // Fetches the next `lines` cache lines (fewer at the end).
  template <int lines>
  void step() {
#pragma GCC unroll 8
    for (int i = 0; i < lines && row_; ++i) _mm_prefetch(next_line(), _MM_HINT_T1);
  }

  // The next line's address, and moves past it; call only while active().
  const char* next_line() {
    const char* line = row_ + offset_;
    offset_ += 64;
    if (offset_ >= width_) {
      offset_ = 0;
      row_ = --rows_left_ > 0 ? row_ + stride_ : nullptr;
    }
    return line;
  }

 private:
  const char* row_ = nullptr;
  int64_t offset_ = 0, width_ = 0, stride_ = 0, rows_left_ = 0;
};

}  // namespace ellm
