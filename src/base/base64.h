#pragma once
// Standard base64 (RFC 4648, '+' and '/'), for thinking signatures and image data URIs.
#include <optional>
#include <string>
#include <string_view>

namespace ellm {

std::string base64_encode(std::string_view bytes);

// nullopt on any character outside the alphabet, on data after the '=' padding and on a length
// that no encoding gives; the padding itself may be left out. ASCII whitespace is skipped (MIME
// wraps base64 in lines).
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace ellm
