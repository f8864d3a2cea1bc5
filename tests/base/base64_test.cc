#include "base/base64.h"

#include <gtest/gtest.h>

namespace ellm {
namespace {

TEST(Base64, RoundTripsEveryLength) {
  std::string bytes;
  for (int n = 0; n < 40; ++n) {
    EXPECT_EQ(base64_decode(base64_encode(bytes)), bytes) << n;
    bytes += char(n * 37 + 200);
  }
  EXPECT_EQ(base64_encode("Man"), "TWFu");
  EXPECT_EQ(base64_encode("Ma"), "TWE=");
  EXPECT_EQ(base64_encode("M"), "TQ==");
}

TEST(Base64, PaddingIsOptionalAndWhitespaceSkipped) {
  EXPECT_EQ(base64_decode("TQ"), "M");
  EXPECT_EQ(base64_decode("TWE"), "Ma");
  EXPECT_EQ(base64_decode("TW\r\nFu TQ=="), "ManM");
}

TEST(Base64, MalformedTextIsRefused) {
  EXPECT_EQ(base64_decode("TWF*"), std::nullopt);      // outside the alphabet
  EXPECT_EQ(base64_decode("TWFu-_"), std::nullopt);    // base64url is another alphabet
  EXPECT_EQ(base64_decode("TQ==TQ=="), std::nullopt);  // data after the padding
  EXPECT_EQ(base64_decode("TWFuT"), std::nullopt);     // a lone sixth of a byte
  EXPECT_EQ(base64_decode("TQ="), std::nullopt);       // padding that does not fill the group
  EXPECT_EQ(base64_decode("TQ==="), std::nullopt);
}

}  // namespace
}  // namespace ellm
