// libFuzzer target: parse and render arbitrary template text against a small chat context.
// Any ellm::Error is an accepted outcome; a crash, a sanitizer report, a leak or a hang is a
// bug. Tight limits keep every input fast.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/jinja/jinja.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Hi <tool_response>x</tool_response>"},
      {"role": "assistant", "content": "<think>\nplan\n</think>\n\nDone.",
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [true, null, 2.5]}}}]},
      {"role": "tool", "content": "{\"ok\": 1}"}],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}],
    "add_generation_prompt": true, "enable_thinking": false, "bos_token": "<s>", "eos_token": "</s>"
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  std::string source(reinterpret_cast<const char*>(data), size);
  ellm::jinja::Limits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_list_items = 10000;
  limits.max_steps = 200000;
  try {
    ellm::jinja::Template::parse(source, "fuzz").render(context(), limits);
  } catch (const ellm::Error&) {
  }
  return 0;
}
