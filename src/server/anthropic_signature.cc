// Thinking blocks' signatures (anthropic_request.h): the reasoning in base64 behind a marker.
#include <cstdint>
#include <string>
#include <string_view>

#include "base/base64.h"
#include "server/anthropic_request.h"

namespace ellm {

namespace {

constexpr std::string_view kSignaturePrefix = "ellm-thinking-v1:";

}  // namespace

std::string thinking_signature(std::string_view reasoning) {
  return std::string(kSignaturePrefix) + base64_encode(reasoning);
}

std::optional<std::string> reasoning_from_signature(std::string_view signature) {
  if (!signature.starts_with(kSignaturePrefix)) return std::nullopt;
  return base64_decode(signature.substr(kSignaturePrefix.size()));
}

}  // namespace ellm
