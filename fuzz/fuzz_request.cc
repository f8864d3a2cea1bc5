// Fuzzes the HTTP request body parsers: arbitrary bytes as a chat and as a completions body
// must give a clean Error (the server's 400), never a crash, a hang or unbounded recursion.
#include <cstdint>
#include <string_view>

#include "base/error.h"
#include "engine/engine.h"
#include "server/api_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  ellm::SamplingParams defaults;
  try {
    nlohmann::ordered_json json = ellm::parse_body(body);
    try {
      ellm::parse_chat_request(json, defaults);
    } catch (const ellm::Error&) {
    }
    ellm::parse_completion_request(json, defaults);
  } catch (const ellm::Error&) {
  }
  return 0;
}
