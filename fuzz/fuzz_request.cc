// Fuzzes the HTTP request body parsers: arbitrary bytes as a chat, a completions and an Anthropic
// Messages body
// must give a clean ApiError with a 4xx status (or an Error), never a crash, a hang or unbounded
// recursion.
#include <cstdint>
#include <string_view>

#include "base/error.h"
#include "engine/engine.h"
#include "server/anthropic_request.h"
#include "server/api_request.h"

namespace {

void check_client_error(const ellm::ApiError& e) {
  if (e.status < 400 || e.status > 499) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  ellm::SamplingParams defaults;
  nlohmann::ordered_json json;
  try {
    json = ellm::parse_body(body);
  } catch (const ellm::ApiError& e) {
    check_client_error(e);
    return 0;
  }
  for (auto parse : {+[](const nlohmann::ordered_json& j, const ellm::SamplingParams& d) {
                       ellm::parse_chat_request(j, d);
                     },
                     +[](const nlohmann::ordered_json& j, const ellm::SamplingParams& d) {
                       ellm::parse_completion_request(j, d);
                     },
                     +[](const nlohmann::ordered_json& j, const ellm::SamplingParams& d) {
                       ellm::parse_messages_request(j, d);
                     }}) {
    try {
      parse(json, defaults);
    } catch (const ellm::ApiError& e) {
      check_client_error(e);
    } catch (const ellm::Error&) {
    }
  }
  return 0;
}
