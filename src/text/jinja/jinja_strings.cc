#include "text/jinja/jinja_strings.h"

#include <algorithm>

#include <utf8proc.h>

namespace ellm::jinja {

char32_t next_codepoint(std::string_view s, size_t& pos) {
  utf8proc_int32_t cp = 0;
  utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + pos),
                                        utf8proc_ssize_t(s.size() - pos), &cp);
  if (n <= 0) {
    pos += 1;
    return 0xFFFD;
  }
  pos += size_t(n);
  return char32_t(cp);
}

std::vector<std::string_view> split_codepoints(std::string_view s) {
  std::vector<std::string_view> out;
  for_each_codepoint(s, [&](char32_t, std::string_view bytes) { out.push_back(bytes); });
  return out;
}

size_t codepoint_count(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_printable(char32_t cp) {
  if (cp == ' ') return true;
  switch (utf8proc_category(utf8proc_int32_t(cp))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}

bool is_space(char32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85) return true;
  if (cp < 0xA0) return false;
  auto cat = utf8proc_category(utf8proc_int32_t(cp));
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<std::string_view> cps = split_codepoints(s);
  std::vector<char32_t> strip_set;
  if (chars) for_each_codepoint(*chars, [&](char32_t cp, std::string_view) { strip_set.push_back(cp); });
  auto strippable = [&](std::string_view bytes) {
    size_t pos = 0;
    char32_t cp = next_codepoint(bytes, pos);
    if (!chars) return is_space(cp);
    return std::find(strip_set.begin(), strip_set.end(), cp) != strip_set.end();
  };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strippable(cps[begin])) ++begin;
  if (right)
    while (end > begin && strippable(cps[end - 1])) --end;
  if (begin == end) return "";
  size_t from = size_t(cps[begin].data() - s.data());
  size_t to = size_t(cps[end - 1].data() + cps[end - 1].size() - s.data());
  return std::string(s.substr(from, to - from));
}

// Whitespace split: runs of whitespace separate fields; leading/trailing whitespace yields none.
static std::vector<std::string> split_whitespace(std::string_view s, int64_t maxsplit) {
  std::vector<std::string> out;
  std::vector<std::string_view> cps = split_codepoints(s);
  auto space = [&](size_t i) {
    size_t pos = 0;
    return is_space(next_codepoint(cps[i], pos));
  };
  size_t i = 0;
  while (i < cps.size()) {
    while (i < cps.size() && space(i)) ++i;
    if (i == cps.size()) break;
    size_t start = size_t(cps[i].data() - s.data());
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      out.emplace_back(py_strip(s.substr(start), nullptr, false, true));
      break;
    }
    while (i < cps.size() && !space(i)) ++i;
    size_t end = i < cps.size() ? size_t(cps[i].data() - s.data()) : s.size();
    out.emplace_back(s.substr(start, end - start));
  }
  return out;
}

std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  if (!sep) return split_whitespace(s, maxsplit);
  if (sep->empty()) return {std::string(s)};  // callers reject an empty separator first
  std::vector<std::string> out;
  size_t start = 0;
  while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
    size_t hit = s.find(*sep, start);
    if (hit == std::string_view::npos) break;
    out.emplace_back(s.substr(start, hit - start));
    start = hit + sep->size();
  }
  out.emplace_back(s.substr(start));
  return out;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  if (!sep || maxsplit < 0 || sep->empty()) return py_split(s, sep, maxsplit);  // same without a limit
  std::vector<std::string> out;
  size_t end = s.size();
  while (int64_t(out.size()) < maxsplit && end >= sep->size()) {
    size_t hit = s.rfind(*sep, end - sep->size());
    if (hit == std::string_view::npos) break;
    out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
    end = hit;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::string py_replace(std::string_view s, std::string_view from, std::string_view to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every code point
    int64_t done = 0;
    for (std::string_view cp : split_codepoints(s)) {
      if (count < 0 || done < count) out += to, ++done;
      out += cp;
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(from, start);
    if (hit == std::string_view::npos) break;
    out += s.substr(start, hit - start);
    out += to;
    start = hit + from.size();
    ++done;
  }
  out += s.substr(start);
  return out;
}

static std::string map_case(std::string_view s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for_each_codepoint(s, [&](char32_t cp, std::string_view) {
    utf8proc_int32_t mapped = upper ? utf8proc_toupper(utf8proc_int32_t(cp)) : utf8proc_tolower(utf8proc_int32_t(cp));
    utf8proc_uint8_t buf[4];
    out.append(reinterpret_cast<char*>(buf), size_t(utf8proc_encode_char(mapped, buf)));
  });
  return out;
}

std::string py_lower(std::string_view s) { return map_case(s, false); }
std::string py_upper(std::string_view s) { return map_case(s, true); }

static bool is_cased_letter(char32_t cp) {
  auto cat = utf8proc_category(utf8proc_int32_t(cp));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

static void append_cp(std::string& out, utf8proc_int32_t cp) {
  utf8proc_uint8_t buf[4];
  out.append(reinterpret_cast<char*>(buf), size_t(utf8proc_encode_char(cp, buf)));
}

// Python's str.title(): a letter after a cased letter is lowered, any other letter is titled.
std::string py_title(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for_each_codepoint(s, [&](char32_t cp, std::string_view) {
    utf8proc_int32_t c = utf8proc_int32_t(cp);
    append_cp(out, previous_cased ? utf8proc_tolower(c) : utf8proc_totitle(c));
    previous_cased = is_cased_letter(cp);
  });
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for_each_codepoint(s, [&](char32_t cp, std::string_view) {
    utf8proc_int32_t c = utf8proc_int32_t(cp);
    append_cp(out, first ? utf8proc_totitle(c) : utf8proc_tolower(c));
    first = false;
  });
  return out;
}

}  // namespace ellm::jinja
