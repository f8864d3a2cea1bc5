#include "engine/stop.h"

#include <gtest/gtest.h>

namespace ellm {
namespace {

// Feeds pieces and returns everything emitted, as a client would see it.
std::string run(StopStringMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& piece : pieces) {
    out += m.push(piece);
    if (m.stopped()) return out;
  }
  return out + m.flush();
}

TEST(StopStrings, PassThroughWithoutStops) {
  StopStringMatcher m;
  m.reset({});
  EXPECT_EQ(m.push("hello"), "hello");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStrings, StopSplitAcrossPiecesIsNeverEmitted) {
  StopStringMatcher m;
  m.reset({"</end>"});
  EXPECT_EQ(m.push("abc</"), "abc");  // "</" might start the stop string: held
  EXPECT_EQ(m.push("en"), "");
  EXPECT_EQ(m.push("d>tail"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "</end>");
  EXPECT_EQ(m.push("more"), "");
}

TEST(StopStrings, HeldTextIsReleasedWhenItDiverges) {
  StopStringMatcher m;
  m.reset({"STOP"});
  EXPECT_EQ(run(m, {"a S", "T", "x", "yz"}), "a STxyz");
  EXPECT_FALSE(m.stopped());
  m.reset({"STOP"});
  EXPECT_EQ(run(m, {"ends with ST"}), "ends with ST");  // flushed at the end
}

TEST(StopStrings, EarliestOfSeveralStopsWins) {
  StopStringMatcher m;
  m.reset({"world", "lo w", ""});
  EXPECT_EQ(run(m, {"hel", "lo world"}), "hel");
  EXPECT_EQ(m.matched(), "lo w");
}

TEST(StopStrings, StopInsideOnePiece) {
  StopStringMatcher m;
  m.reset({"\n\n"});
  EXPECT_EQ(run(m, {"line one\n\nline two"}), "line one");
  EXPECT_TRUE(m.stopped());
}

TEST(StopStrings, MultibyteStopsHoldWholeCharacters) {
  StopStringMatcher m;
  m.reset({"é!"});
  EXPECT_EQ(m.push("caf\xc3\xa9"), "caf");  // "é" could begin "é!"
  EXPECT_EQ(m.push("?"), "\xc3\xa9?");
}

}  // namespace
}  // namespace ellm
