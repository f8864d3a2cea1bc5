// Every code point through the character classes of the pre-tokenizer regex (\s, \S, \p{L},
// \p{N} and the [^\s\p{L}\p{N}] of the Qwen/GPT-4 patterns), compiled as the tokenizer compiles
// them, against tables generated from an independent source: Python's unicodedata, Unicode
// 14.0.0 (scripts/gen_unicode_classes.py), the version of the Oniguruma that Hugging Face
// tokenizers uses.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "text/tokenizer/unicode.h"
#include "text/tokenizer/unicode_regex.h"

namespace ellm {
namespace {

struct CodePointRange {
  char32_t first, last;
};
#include "unicode_classes.inc"

constexpr char32_t kCodePoints = 0x110000;
bool is_surrogate(char32_t cp) { return cp >= 0xD800 && cp <= 0xDFFF; }

template <size_t N>
std::vector<bool> table(const CodePointRange (&ranges)[N]) {
  std::vector<bool> in(kCodePoints, false);
  for (const CodePointRange& r : ranges)
    for (char32_t cp = r.first; cp <= r.last; cp++) in[cp] = true;
  return in;
}

// Code points matched by `pattern` (a single-character class) in a text of every code point.
std::vector<bool> matched(const std::string& pattern) {
  std::string text;
  for (char32_t cp = 0; cp < kCodePoints; cp++)
    if (!is_surrogate(cp)) unicode::append_utf8(cp, text);
  std::vector<bool> in(kCodePoints, false);
  UnicodeRegex regex(pattern, "test");
  regex.matches(text, [&](size_t begin, size_t end) {
    for (size_t at = begin; at < end;) {
      int length = 0;
      in[unicode::decode_utf8(std::string_view(text).substr(at), length)] = true;
      at += static_cast<size_t>(length);
    }
  });
  return in;
}

void expect_same(const std::string& pattern, const std::vector<bool>& expected) {
  std::vector<bool> got = matched(pattern);
  int mismatches = 0;
  for (char32_t cp = 0; cp < kCodePoints; cp++) {
    if (is_surrogate(cp) || got[cp] == expected[cp]) continue;
    if (++mismatches <= 10)
      ADD_FAILURE() << pattern << ": U+" << std::hex << std::uppercase << static_cast<uint32_t>(cp)
                    << (got[cp] ? " matches, but is not" : " does not match, but is") << " in the Unicode "
                    << kUnicodeClassesVersion << " class";
  }
  EXPECT_EQ(mismatches, 0) << pattern;
}

TEST(UnicodeClasses, TablesAreUnicode14) { EXPECT_STREQ(kUnicodeClassesVersion, "14.0.0"); }

TEST(UnicodeClasses, WhiteSpaceIsUnicodeWhiteSpace) {
  std::vector<bool> space = table(kWhiteSpaceRanges);
  EXPECT_FALSE(space[0x180E]) << "U+180E has been a format character (Cf) since Unicode 6.3";
  EXPECT_TRUE(space[0x85]);
  expect_same(R"(\s)", space);
  std::vector<bool> not_space(kCodePoints);
  for (char32_t cp = 0; cp < kCodePoints; cp++) not_space[cp] = !space[cp];
  expect_same(R"(\S)", not_space);
}

TEST(UnicodeClasses, LettersAndNumbers) {
  expect_same(R"(\p{L})", table(kLetterRanges));
  expect_same(R"(\p{N})", table(kNumberRanges));
}

TEST(UnicodeClasses, NegatedClassOfThePreTokenizer) {
  std::vector<bool> space = table(kWhiteSpaceRanges), letter = table(kLetterRanges), number = table(kNumberRanges);
  std::vector<bool> other(kCodePoints);
  for (char32_t cp = 0; cp < kCodePoints; cp++) other[cp] = !space[cp] && !letter[cp] && !number[cp];
  expect_same(R"([^\s\p{L}\p{N}])", other);
  std::vector<bool> space_or_letter(kCodePoints);
  for (char32_t cp = 0; cp < kCodePoints; cp++) space_or_letter[cp] = space[cp] || letter[cp];
  expect_same(R"([\s\p{L}])", space_or_letter);
}

TEST(UnicodeClasses, RewriteLeavesOtherEscapesAlone) {
  EXPECT_EQ(oniguruma_compatible_pattern(R"(\p{L}+|\\s|\Q\s\E|[\]\s])"),
            R"(\p{L}+|\\s|\Q\s\E|[\]\t-\r\x{85}\p{Zs}\p{Zl}\p{Zp}])");
  EXPECT_EQ(oniguruma_compatible_pattern(R"([]\s]\S)"), R"([]\t-\r\x{85}\p{Zs}\p{Zl}\p{Zp}][^\t-\r\x{85}\p{Zs}\p{Zl}\p{Zp}])");
}

}  // namespace
}  // namespace ellm
