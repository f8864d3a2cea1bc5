// Fuzzes OutputParser with random text pushed in random pieces, tool calls sent whole and
// streamed. Checks that the deltas add up to result(), that the result does not depend on the
// split, that every tool call sent whole has a JSON object for arguments, and that streaming the
// calls keeps every call the whole parse finds, unchanged (it may add calls that went wrong
// after their name was sent).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "server/output_parser.h"

namespace {

using ellm::OutputParser;
using ellm::ParsedOutput;

const nlohmann::json& tools() {
  static const nlohmann::json value = nlohmann::json::parse(R"([
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
      "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
      "b": {"type": "boolean"}, "o": {"type": "object"}, "a": {"type": "array"}}}}},
    {"type": "function", "function": {"name": "get_weather"}}])");
  return value;
}

void check(bool ok) {
  if (!ok) std::abort();
}

ParsedOutput run(uint8_t flags, bool stream_calls, const std::string& text, const std::vector<size_t>& cuts) {
  auto format = static_cast<ellm::ToolCallFormat>(flags % 3);
  OutputParser parser(format, flags & 4, flags & 8, (flags & 16) ? tools() : nlohmann::json());
  if (stream_calls) parser.stream_tool_calls();
  ParsedOutput streamed;
  auto add = [&](const ellm::OutputDelta& delta) {
    streamed.content += delta.content;
    streamed.reasoning += delta.reasoning;
    for (const auto& call : delta.tool_calls) {
      if (call.index == static_cast<int>(streamed.tool_calls.size()))
        streamed.tool_calls.push_back({call.id, call.name, ""});
      check(call.index >= 0 && call.index < static_cast<int>(streamed.tool_calls.size()));
      streamed.tool_calls[call.index].arguments += call.arguments;
    }
  };
  size_t from = 0;
  for (size_t cut : cuts) {
    add(parser.push(std::string_view(text).substr(from, cut - from)));
    from = cut;
  }
  add(parser.push(std::string_view(text).substr(from)));
  add(parser.finish());
  const ParsedOutput& result = parser.result();
  check(streamed.content == result.content && streamed.reasoning == result.reasoning);
  check(streamed.tool_calls.size() == result.tool_calls.size());
  for (size_t i = 0; i < result.tool_calls.size(); ++i) {
    check(streamed.tool_calls[i].id == result.tool_calls[i].id);
    check(streamed.tool_calls[i].name == result.tool_calls[i].name);
    check(streamed.tool_calls[i].arguments == result.tool_calls[i].arguments);
    auto arguments = nlohmann::json::parse(result.tool_calls[i].arguments, nullptr, false);
    check(stream_calls || arguments.is_object());
  }
  return result;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  uint8_t flags = data[0], seed = data[1];
  std::string text(reinterpret_cast<const char*>(data + 2), size - 2);

  std::vector<size_t> cuts;  // increasing split points from a small generator
  uint32_t state = seed * 2654435761u + 1;
  for (size_t pos = 0;;) {
    state = state * 1103515245u + 12345u;
    pos += 1 + (state >> 16) % 9;
    if (pos >= text.size()) break;
    cuts.push_back(pos);
  }
  ParsedOutput results[2];  // [stream_calls]
  for (bool stream_calls : {false, true}) {
    ParsedOutput whole = run(flags, stream_calls, text, {});
    ParsedOutput pieces = run(flags, stream_calls, text, cuts);
    check(whole.content == pieces.content && whole.reasoning == pieces.reasoning);
    check(whole.tool_calls.size() == pieces.tool_calls.size());
    for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
      check(whole.tool_calls[i].name == pieces.tool_calls[i].name);
      check(whole.tool_calls[i].arguments == pieces.tool_calls[i].arguments);
    }
    results[stream_calls] = std::move(pieces);
  }
  const auto& sent_whole = results[0].tool_calls;
  size_t found = 0;
  for (const auto& call : results[1].tool_calls)
    if (found < sent_whole.size() && call.name == sent_whole[found].name && call.arguments == sent_whole[found].arguments)
      ++found;
  check(found == sent_whole.size());
  return 0;
}
