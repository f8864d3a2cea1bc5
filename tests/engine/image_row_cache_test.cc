// The image cache (engine/prompt_images.h): rows found by content and grid, the least recently
// used dropped first when the budget is reached, and nothing kept beyond it.
#include <gtest/gtest.h>

#include "engine/prompt_images.h"

namespace ellm {
namespace {

PromptImage image(uint64_t hash, int64_t grid_h = 4, int64_t grid_w = 4) {
  PromptImage out;
  out.grid_h = grid_h, out.grid_w = grid_w, out.merged_h = grid_h / 2, out.merged_w = grid_w / 2;
  out.content_hash = hash;
  return out;
}

ImageRows rows(size_t floats, float value) { return std::make_shared<const std::vector<float>>(floats, value); }

TEST(ImageRowCache, FindsByContentAndGridAndDropsTheLeastRecentlyUsed) {
  ImageRowCache cache(3 * 100 * sizeof(float));
  cache.insert(image(1), rows(100, 1));
  cache.insert(image(2), rows(100, 2));
  cache.insert(image(3), rows(100, 3));
  EXPECT_EQ(cache.bytes(), 300 * sizeof(float));
  ASSERT_TRUE(cache.find(image(1)));
  EXPECT_EQ((*cache.find(image(1)))[0], 1);
  EXPECT_FALSE(cache.find(image(1, 4, 6)));  // the same hash at another grid is another image
  cache.insert(image(4), rows(100, 4));       // 2 is now the least recently used
  EXPECT_FALSE(cache.find(image(2)));
  EXPECT_TRUE(cache.find(image(1)) && cache.find(image(3)) && cache.find(image(4)));
  EXPECT_EQ(cache.bytes(), 300 * sizeof(float));
  cache.insert(image(5), rows(250, 5));  // needs the room of three
  EXPECT_TRUE(cache.find(image(5)));
  EXPECT_EQ(cache.bytes(), 250 * sizeof(float));
}

TEST(ImageRowCache, KeepsNothingBeyondItsBudget) {
  ImageRowCache none(0);
  none.insert(image(1), rows(10, 1));
  EXPECT_FALSE(none.find(image(1)));
  EXPECT_EQ(none.bytes(), 0u);
  ImageRowCache small(40 * sizeof(float));
  small.insert(image(1), rows(10, 1));
  small.insert(image(2), rows(50, 2));  // larger than the whole budget: not kept, nothing dropped
  EXPECT_TRUE(small.find(image(1)));
  EXPECT_FALSE(small.find(image(2)));
}

}  // namespace
}  // namespace ellm
