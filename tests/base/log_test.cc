#include "base/log.h"

#include <gtest/gtest.h>

namespace ellm {
namespace {

TEST(FormatBytes, PicksTheUnitThatKeepsOneOrMore) {
  EXPECT_EQ(format_bytes(0), "0 bytes");
  EXPECT_EQ(format_bytes(768), "768 bytes");
  EXPECT_EQ(format_bytes(1024), "1.0 KiB");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(112 * 1024), "112.0 KiB");          // Qwen3-0.6B KV per token
  EXPECT_EQ(format_bytes(28.5 * (1 << 20)), "28.5 MiB");
  EXPECT_EQ(format_bytes(7.0 * (1ull << 30)), "7.0 GiB");
  EXPECT_EQ(format_bytes(3.0 * (1ull << 40)), "3.0 TiB");
  EXPECT_EQ(format_bytes(5000.0 * (1ull << 40)), "5000.0 TiB");  // no unit past TiB
}

}  // namespace
}  // namespace ellm
