// RowFetch walks a block of cache rows line by line in memory order: every line of every row
// once, nothing outside the block, then stops.
#include "kernels/row_fetch.h"

#include <gtest/gtest.h>

#include <vector>

namespace ellm {
namespace {

TEST(RowFetch, WalksEveryLineOfTheRowsInMemoryOrderThenStops) {
  // 3 rows of 2 heads x 64 FP16 (256 bytes = 4 lines) out of rows of 8 heads, from head 2.
  constexpr int64_t ld = 8 * 64, first_row = 5, rows = 3, width = 2 * 64;
  std::vector<uint16_t> cache(16 * ld);
  const uint16_t* base = cache.data() + 2 * 64;
  RowFetch fetch(base, first_row, rows, ld, width);
  std::vector<const char*> want;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t byte = 0; byte < width * 2; byte += 64)
      want.push_back(reinterpret_cast<const char*>(base + (first_row + r) * ld) + byte);
  std::vector<const char*> got;
  while (fetch.active()) got.push_back(fetch.next_line());
  EXPECT_EQ(got, want);
  fetch.step<4>();  // done: stepping on fetches nothing and stays done
  EXPECT_FALSE(fetch.active());
}

TEST(RowFetch, StepFetchesAtMostItsLinesAndNoRowsMeansNothing) {
  std::vector<uint16_t> cache(4 * 64);
  RowFetch fetch(cache.data(), 0, 2, 64, 64);  // 2 rows of 2 lines
  fetch.step<3>();
  ASSERT_TRUE(fetch.active());
  EXPECT_EQ(fetch.next_line(), reinterpret_cast<const char*>(cache.data() + 64) + 64);
  EXPECT_FALSE(fetch.active());
  EXPECT_FALSE(RowFetch(cache.data(), 3, 0, 64, 64).active());
  EXPECT_FALSE(RowFetch(cache.data(), 3, -2, 64, 64).active());
  EXPECT_FALSE(RowFetch().active());
}

}  // namespace
}  // namespace ellm
