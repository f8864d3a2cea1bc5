// Thinking blocks' signatures (anthropic_request.h): the reasoning in base64 behind a marker.
#include <cstdint>
#include <string>
#include <string_view>

#include "server/anthropic_request.h"

namespace ellm {

namespace {

constexpr std::string_view kSignaturePrefix = "ellm-thinking-v1:";
constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

std::string thinking_signature(std::string_view reasoning) {
  std::string out(kSignaturePrefix);
  uint32_t bits = 0;
  int count = 0;
  for (unsigned char c : reasoning) {
    bits = (bits << 8) | c;
    count += 8;
    while (count >= 6) out += kBase64[(bits >> (count -= 6)) & 63];
  }
  if (count > 0) out += kBase64[(bits << (6 - count)) & 63];
  while ((out.size() - kSignaturePrefix.size()) % 4) out += '=';
  return out;
}

std::optional<std::string> reasoning_from_signature(std::string_view signature) {
  if (!signature.starts_with(kSignaturePrefix)) return std::nullopt;
  std::string out;
  uint32_t bits = 0;
  int count = 0;
  for (char c : signature.substr(kSignaturePrefix.size())) {
    if (c == '=') break;
    const char* at = std::char_traits<char>::find(kBase64, 64, c);
    if (!at) return std::nullopt;
    bits = (bits << 6) | uint32_t(at - kBase64);
    count += 6;
    if (count >= 8) out += char((bits >> (count -= 8)) & 0xff);
  }
  return out;
}

}  // namespace ellm
