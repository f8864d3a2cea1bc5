#include "base/memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace ellm {
namespace {

bool all_zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

// A model's mid-sized matrices (a MoE's experts) share huge-page chunks while it loads: they
// follow one another in one 2 MiB-aligned chunk, zero-filled even where a freed chunk's memory
// is handed out again, and freeing them releases the chunk.
TEST(Memory, MidSizedBuffersShareHugePageChunksWhileAModelLoads) {
  const size_t bytes = size_t(1640) << 10;  // Qwen3.8-Flash-Next's down projection in FP8
  for (int round = 0; round < 3; ++round) {
    std::vector<Buffer<uint8_t>> buffers;
    {
      SharedHugePagesScope scope;
      for (int i = 0; i < 8; ++i) {
        buffers.push_back(make_buffer<uint8_t>(bytes));
        ASSERT_TRUE(all_zero(buffers.back().get(), bytes));
        std::memset(buffers.back().get(), 0xab, bytes);
      }
    }
    const uintptr_t first = reinterpret_cast<uintptr_t>(buffers[0].get());
    EXPECT_EQ(first % (size_t(2) << 20), 0u);
    for (int i = 1; i < 8; ++i)  // side by side, 4 KiB-aligned
      EXPECT_EQ(reinterpret_cast<uintptr_t>(buffers[i].get()) - reinterpret_cast<uintptr_t>(buffers[i - 1].get()),
                (bytes + kAlign + 4095) / 4096 * 4096);
    // Outside a load, such a buffer is a heap allocation of its own.
    Buffer<uint8_t> alone = make_buffer<uint8_t>(bytes);
    const uintptr_t a = reinterpret_cast<uintptr_t>(alone.get());
    EXPECT_TRUE(a < first || a >= first + (size_t(64) << 20));
    ASSERT_TRUE(all_zero(alone.get(), bytes));
    buffers.clear();  // frees the chunk; the next round's chunk may reuse its memory
  }
  // Small and huge buffers keep their own allocations, in a scope or not.
  SharedHugePagesScope scope;
  Buffer<float> small = make_buffer<float>(1000), huge = make_buffer<float>(size_t(1) << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(huge.get()) % (size_t(2) << 20), 0u);
  ASSERT_TRUE(all_zero(reinterpret_cast<uint8_t*>(small.get()), 4000));
}

}  // namespace
}  // namespace ellm
