#include "base/base64.h"

#include <cstdint>

namespace ellm {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int digit(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  uint32_t bits = 0;
  int count = 0;
  for (unsigned char c : bytes) {
    bits = (bits << 8) | c;
    count += 8;
    while (count >= 6) out += kAlphabet[(bits >> (count -= 6)) & 63];
  }
  if (count > 0) out += kAlphabet[(bits << (6 - count)) & 63];
  while (out.size() % 4) out += '=';
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t bits = 0;
  int count = 0;
  size_t digits = 0, padding = 0;
  for (char c : text) {
    if (is_space(c)) continue;
    if (c == '=') {
      ++padding;
      continue;
    }
    int d = digit(c);
    if (d < 0 || padding > 0) return std::nullopt;
    bits = (bits << 6) | uint32_t(d);
    count += 6;
    ++digits;
    if (count >= 8) out += char((bits >> (count -= 8)) & 0xff);
  }
  // One digit left over carries no whole byte; padding only fills the last group to four.
  if (digits % 4 == 1 || padding > 2 || (padding > 0 && (digits + padding) % 4 != 0))
    return std::nullopt;
  return out;
}

}  // namespace ellm
