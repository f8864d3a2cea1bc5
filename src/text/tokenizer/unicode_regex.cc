#include "text/tokenizer/unicode_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/error.h"

namespace ellm {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

// Unicode White_Space, as a character class body.
constexpr const char* kWhiteSpace = "\\t-\\r\\x{85}\\p{Zs}\\p{Zl}\\p{Zp}";

}  // namespace

std::string oniguruma_compatible_pattern(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false, quoted = false;
  for (size_t i = 0; i < pattern.size(); i++) {
    const char c = pattern[i];
    if (quoted) {  // \Q...\E: literal text
      if (c == '\\' && i + 1 < pattern.size() && pattern[i + 1] == 'E') {
        quoted = false;
        out += "\\E";
        i++;
      } else {
        out += c;
      }
      continue;
    }
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      i++;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        quoted = e == 'Q';
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' first in a class (after an optional '^') is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {  // [:alpha:]
      size_t close = pattern.find(":]", i + 2);
      if (close != std::string::npos) {
        out.append(pattern, i, close + 2 - i);
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

UnicodeRegex::UnicodeRegex(const std::string& source, const std::string& where) {
  const std::string pattern = oniguruma_compatible_pattern(source);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!code)
    fail(where, "pre-tokenizer regex does not compile at offset " + std::to_string(offset) + ": " +
                    pcre2_message(error));
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional: pcre2_match falls back if it failed
  code_ = code;
}

UnicodeRegex::~UnicodeRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void* UnicodeRegex::new_match_data() const {
  return pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(code_), nullptr);
}

void UnicodeRegex::free_match_data(void* match_data) {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data));
}

bool UnicodeRegex::find(std::string_view text, size_t start, size_t& begin, size_t& end,
                        void* match_data) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto* md = static_cast<pcre2_match_data*>(match_data);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // The text was validated once by the caller; an empty match is not a piece, so skip it.
  uint32_t options = PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY;
  int rc = pcre2_match(code, subject, text.size(), start, options, md, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // the interpreter keeps its backtrack stack on the heap
    rc = pcre2_match(code, subject, text.size(), start, options | PCRE2_NO_JIT, md, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) throw Error("tokenizer: pre-tokenizer regex failed: " + pcre2_message(rc));
  PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(md);
  begin = ovector[0];
  end = ovector[1];
  return true;
}

}  // namespace ellm
