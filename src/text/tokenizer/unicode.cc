#include "text/tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

namespace ellm::unicode {
namespace {

// Allowed range of the second byte of a sequence, by lead byte (Unicode Table 3-7); the third
// and fourth bytes are always 80..BF. Returns the total sequence length, 0 for a bad lead.
int sequence_length(unsigned char lead, unsigned char& lo, unsigned char& hi) {
  lo = 0x80, hi = 0xBF;
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;
  if (lead < 0xE0) return 2;
  if (lead == 0xE0) lo = 0xA0;
  if (lead == 0xED) hi = 0x9F;
  if (lead < 0xF0) return 3;
  if (lead == 0xF0) lo = 0x90;
  if (lead == 0xF4) hi = 0x8F;
  if (lead < 0xF5) return 4;
  return 0;
}

// Length of the well-formed character at s[i], or -(length of the maximal ill-formed subpart),
// or 0 if s ends inside a sequence that is well-formed so far.
int scan_char(std::string_view s, size_t i) {
  unsigned char lo, hi;
  int length = sequence_length(static_cast<unsigned char>(s[i]), lo, hi);
  if (length == 0) return -1;
  for (int k = 1; k < length; ++k) {
    if (i + k >= s.size()) return 0;
    unsigned char c = static_cast<unsigned char>(s[i + k]);
    if (c < lo || c > hi) return -k;
    lo = 0x80, hi = 0xBF;
  }
  return length;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

size_t find_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    int n = scan_char(s, i);
    if (n <= 0) return i;
    i += n;
  }
  return kValid;
}

size_t append_utf8_lossy(std::string_view bytes, bool final, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    int n = scan_char(bytes, i);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else if (n < 0) {
      out.append(kReplacement);
      i += -n;
    } else if (final) {  // truncated at the very end: one U+FFFD for the whole partial sequence
      out.append(kReplacement);
      i = bytes.size();
    } else {
      break;
    }
  }
  return i;
}

char32_t decode_utf8(std::string_view s, int& length) {
  unsigned char c = static_cast<unsigned char>(s[0]);
  length = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  char32_t cp = length == 1 ? c : c & (0x7F >> length);
  for (int k = 1; k < length; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[k]) & 0x3F);
  return cp;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

void append_nfc(std::string_view text, std::string& out) {
  utf8proc_uint8_t* mapped = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                    static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                                    static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(mapped, &std::free);
  if (n < 0) out.append(text);  // cannot happen for valid UTF-8; keep the text as it is
  else out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
}

// Characters below U+0300 (UTF-8 lead byte < 0xCC) are NFC already, have combining class 0 and
// never compose with what precedes them (the first combining mark is U+0300), so NFC never
// changes anything across the boundary before one of them.
bool below_u0300(char c) { return static_cast<unsigned char>(c) < 0xCC; }
bool is_lead_byte(char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }

}  // namespace

bool nfc(std::string_view text, std::string& out) {
  size_t first = 0;
  while (first < text.size() && below_u0300(text[first])) ++first;
  if (first == text.size()) return false;
  out.clear();
  out.reserve(text.size() + text.size() / 8);
  size_t copied = 0;
  for (size_t i = first; i < text.size();) {
    // text[i] starts a run of characters at or above U+0300: normalize it together with the
    // character before it (which may compose with it), up to the next character below U+0300.
    size_t begin = i;
    if (begin > 0) do --begin; while (begin > copied && !is_lead_byte(text[begin]));
    size_t end = i;
    while (end < text.size() && !(is_lead_byte(text[end]) && below_u0300(text[end]))) ++end;
    out.append(text.substr(copied, begin - copied));
    append_nfc(text.substr(begin, end - begin), out);
    copied = end;
    i = end;
    while (i < text.size() && below_u0300(text[i])) ++i;
  }
  out.append(text.substr(copied));
  return true;
}

const std::array<char32_t, 256>& byte_to_codepoint() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

int codepoint_to_byte(char32_t cp) {
  static const std::array<int16_t, 512> inverse = [] {
    std::array<int16_t, 512> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_codepoint()[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

}  // namespace ellm::unicode
