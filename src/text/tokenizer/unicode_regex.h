#pragma once
// The pre-tokenizer split: a Unicode regex (PCRE2, UTF + UCP so \p{L}, \p{N} and \s follow
// Unicode properties, JIT-compiled when the platform supports it).
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace ellm {

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

}  // namespace ellm
