// Fuzzes the schema compiler and the byte matcher (engine/json_schema.h, grammar_matcher.h).
// Input: a mode byte (bits 0-1: schema, pattern or tool parameters in either format; bit 2: not
// strict), a schema (JSON; or a pattern; or tool parameters), then after a NUL the bytes to feed. Bad schemas must throw SchemaError, never crash or hang. For a schema that
// compiles, the matcher takes the bytes, and from every state it reaches the budget logic holds:
// some byte brings the end exactly one byte closer, so a walk of min_bytes() bytes completes it.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

// Finishes the output from `m` one byte at a time, each step one byte closer to the end.
void close_from(const ellm::GrammarMatcher& start) {
  ellm::GrammarMatcher m, next;
  m.copy_from(start);
  for (int64_t need = m.min_bytes(); need > 0; need = m.min_bytes()) {
    check(need < 100000);
    bool found = false;
    for (int b = 0; b < 256 && !found; ++b) {
      next.copy_from(m);
      found = next.feed(b) && next.min_bytes() == need - 1;
    }
    check(found);
    m.copy_from(next);
  }
  check(m.can_end());
}

int nesting(std::string_view text) {
  int depth = 0, deepest = 0;
  for (char c : text) {
    if (c == '{' || c == '[') deepest = std::max(deepest, ++depth);
    if (c == '}' || c == ']') --depth;
  }
  return deepest;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 4096) return 0;
  const uint8_t mode = data[0] % 4;
  const bool strict = (data[0] & 4) == 0;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  size_t split = rest.find('\0');
  std::string_view schema_text = rest.substr(0, split);
  std::string_view feed = split == std::string_view::npos ? std::string_view() : rest.substr(split + 1);
  if (nesting(schema_text) > 60) return 0;

  std::shared_ptr<const ellm::Grammar> grammar;
  try {
    if (mode == 1) {
      ellm::Regex regex = ellm::compile_regex(std::string(schema_text));
      uint64_t state = ellm::kRegexStart;
      for (char c : feed) state = state ? ellm::regex_step(regex, state, uint8_t(c)) : 0;
      if (state) (void)ellm::regex_distance(regex, state);
      return 0;
    }
    nlohmann::json schema = nlohmann::json::parse(schema_text, nullptr, /*allow_exceptions=*/false);
    if (schema.is_discarded()) return 0;
    if (mode == 0) {
      grammar = ellm::compile_json_schema(schema, strict);
    } else {
      nlohmann::json tools = nlohmann::json::array({{{"type", "function"},
                                                     {"function", {{"name", "f"}, {"strict", strict}, {"parameters", schema}}}}});
      grammar = ellm::compile_tool_calls(tools, mode == 2 ? ellm::ToolCallStyle::hermes : ellm::ToolCallStyle::qwen3_coder,
                                         "", 2);
    }
  } catch (const ellm::SchemaError& e) {
    check(!e.keyword.empty());
    return 0;
  }
  ellm::GrammarMatcher m(grammar.get());
  close_from(m);
  for (size_t i = 0; i < feed.size() && i < 512; ++i) {
    if (!m.feed(uint8_t(feed[i]))) return 0;
    if (i % 16 == 15) close_from(m);
  }
  close_from(m);
  return 0;
}
