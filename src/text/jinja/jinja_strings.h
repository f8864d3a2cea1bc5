#pragma once
// Python str semantics on UTF-8 strings: templates index, slice, strip and split by code point,
// as Python does. Ill-formed bytes (never produced from validated input) count as one code
// point each so nothing here can loop or read out of bounds.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ellm::jinja {

// Calls fn(code point, its bytes) for each code point of s.
template <typename Fn>
void for_each_codepoint(std::string_view s, Fn&& fn);

char32_t next_codepoint(std::string_view s, size_t& pos);  // advances pos; U+FFFD if ill-formed
std::vector<std::string_view> split_codepoints(std::string_view s);
size_t codepoint_count(std::string_view s);
bool is_printable(char32_t cp);  // Python's str.isprintable for one character
bool is_space(char32_t cp);      // Python's str.isspace for one character

// str.strip/lstrip/rstrip: `chars` empty-and-not-given means whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.split(sep, maxsplit): sep null means runs of whitespace. maxsplit < 0 means no limit.
std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> py_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
std::string py_replace(std::string_view s, std::string_view from, std::string_view to, int64_t count);
std::string py_lower(std::string_view s);
std::string py_upper(std::string_view s);
std::string py_title(std::string_view s);
std::string py_capitalize(std::string_view s);

template <typename Fn>
void for_each_codepoint(std::string_view s, Fn&& fn) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    char32_t cp = next_codepoint(s, pos);
    fn(cp, s.substr(start, pos - start));
  }
}

}  // namespace ellm::jinja
