#pragma once
// The pre-tokenizer split: a Unicode regex (PCRE2, UTF + UCP so \p{L}, \p{N} and \s follow
// Unicode properties, JIT-compiled when the platform supports it).
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace ellm {

// Hugging Face `tokenizers` compiles pre-tokenizer regexes with Oniguruma (the onig crate,
// which bundles Oniguruma 6.9.8: Unicode 14.0). Its \s is Unicode's White_Space property:
// U+0009-U+000D, U+0085 and the Zs, Zl and Zp categories. PCRE2's \s (with UCP) is not the same
// set: it also holds U+180E MONGOLIAN VOWEL SEPARATOR (white space before Unicode 6.3, a format
// character Cf since), so a run of spaces before U+180E split differently from Hugging Face.
// This returns `pattern` with every \s and \S outside \Q...\E written as that White_Space set
// (\S inside a character class, which a class cannot express, is left to PCRE2). \p{L} and
// \p{N} are the same in both (PCRE2 10.42 and Oniguruma 6.9.8 both use Unicode 14.0);
// tests/text/unicode_classes_test.cc checks all three against Python's unicodedata 14.0.
std::string oniguruma_compatible_pattern(const std::string& pattern);

class UnicodeRegex {
 public:
  // Throws Error naming `where` if the pattern does not compile.
  UnicodeRegex(const std::string& pattern, const std::string& where);
  ~UnicodeRegex();
  UnicodeRegex(const UnicodeRegex&) = delete;
  UnicodeRegex& operator=(const UnicodeRegex&) = delete;

  // Splits valid UTF-8 `text` into consecutive pieces that cover it exactly: every match and
  // every stretch between matches (Hugging Face's Split with behavior "Isolated").
  // Calls on_piece(std::string_view) for each. Thread-safe.
  template <class F>
  void split(std::string_view text, F&& on_piece) const;
  // Calls on_match(size_t begin, size_t end) for each non-empty match, left to right.
  template <class F>
  void matches(std::string_view text, F&& on_match) const;

 private:
  // Finds the next match at or after `start`: sets [begin, end); returns false if none.
  bool find(std::string_view text, size_t start, size_t& begin, size_t& end, void* match_data) const;
  void* new_match_data() const;
  static void free_match_data(void* match_data);

  void* code_ = nullptr;  // pcre2_code_8
};

template <class F>
void UnicodeRegex::split(std::string_view text, F&& on_piece) const {
  std::unique_ptr<void, void (*)(void*)> match_data(new_match_data(), &free_match_data);
  size_t pos = 0, begin = 0, end = 0;
  while (pos < text.size() && find(text, pos, begin, end, match_data.get())) {
    if (begin > pos) on_piece(text.substr(pos, begin - pos));
    on_piece(text.substr(begin, end - begin));
    pos = end;
  }
  if (pos < text.size()) on_piece(text.substr(pos));
}

template <class F>
void UnicodeRegex::matches(std::string_view text, F&& on_match) const {
  std::unique_ptr<void, void (*)(void*)> match_data(new_match_data(), &free_match_data);
  size_t pos = 0, begin = 0, end = 0;
  while (pos < text.size() && find(text, pos, begin, end, match_data.get())) {
    on_match(begin, end);
    pos = end;
  }
}

}  // namespace ellm
