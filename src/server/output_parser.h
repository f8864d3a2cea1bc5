#pragma once
// Splits model output text into content, reasoning (<think>...</think>) and tool calls, as it
// streams. Qwen3 writes tool calls as <tool_call>{"name": ..., "arguments": {...}}</tool_call>
// ("hermes"); Qwen3-Coder as <tool_call><function=NAME><parameter=P>value</parameter>...
// </function></tool_call>. The same class serves non-streaming replies: push everything, finish,
// read result().
//
// Guarantees: the deltas returned by push()/finish(), concatenated, equal result(); the result
// does not depend on how the text was split into pushes; text is never dropped except the
// whitespace that only separates a tag from its surroundings (and the rest of a streamed
// <tool_call> block that goes wrong after a call of it was sent). By default a tool call is
// emitted whole (id, name and arguments in one delta) once its block is complete and valid; an
// invalid block (bad JSON, an unknown function, cut off by the end of generation) becomes plain
// content, verbatim.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/tool_parser.h"

namespace ellm {

// "hermes" or "qwen3" -> hermes_json, "qwen3_coder" -> qwen3_coder_xml, "none"; throws Error
// for anything else.
ToolCallFormat tool_call_format_by_name(const std::string& name);
// The format a chat template renders tool calls in (none when it has no tool calls).
ToolCallFormat detect_tool_call_format(const std::string& chat_template_source);
// True when a rendered prompt leaves the model inside a reasoning block (it ends with an open
// <think>), so the output starts with reasoning and only its closing </think> appears.
bool prompt_opens_reasoning(std::string_view prompt);

struct ToolCallDelta {
  int index = 0;          // position of the call in the reply: 0, 1, 2...
  std::string id;         // set only in the first delta of a call
  std::string name;       // set only in the first delta of a call
  std::string arguments;  // JSON text to append to the call's arguments
};

struct OutputDelta {
  std::string content, reasoning;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

struct ToolCall {
  std::string id, name;
  std::string arguments;  // a JSON object, as text
};

struct ParsedOutput {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;
};

class OutputParser {
 public:
  // tools: the request's OpenAI `tools` array (Coder parameter types, unknown-function check);
  // null or empty = no check. starts_in_reasoning: the prompt opened <think> already.
  OutputParser(ToolCallFormat format, bool parse_reasoning, bool starts_in_reasoning,
               const nlohmann::json& tools);
  ~OutputParser();
  OutputParser(OutputParser&&) noexcept;
  OutputParser& operator=(OutputParser&&) noexcept;

  // Calls come as they are generated (as vLLM streams them): the id and name once the name is
  // known to be a declared tool, then the arguments in fragments (Qwen3: the JSON text as it
  // grows; Qwen3-Coder: a parameter at a time), which add up to what the whole parse reports.
  // A call that goes wrong after its name was sent (bad JSON, cut off by the end of generation)
  // keeps the fragments already sent: a stream cannot take them back.
  void stream_tool_calls() { stream_calls_ = true; }

  // Streaming: what can be emitted now. `text` is the next piece of output (any split).
  OutputDelta push(std::string_view text);
  // End of generation: flushes held-back text; an unfinished tool call becomes content.
  OutputDelta finish();
  // One event of a stream: push(text), and when it is the last, finish() added on.
  OutputDelta push(std::string_view text, bool last);
  // Everything emitted so far (after finish(): the final parse).
  const ParsedOutput& result() const { return result_; }

 private:
  enum class State { start, reasoning, content, tool_call, finished };

  // Text is emitted through a channel that holds back trailing whitespace, so whitespace that
  // only separates a tag from its surroundings can be dropped.
  struct Channel {
    std::string held_space;
    bool at_start = false;   // drop leading whitespace (after <think> or </think>)
    bool after_call = false;  // nothing but whitespace since a tool call
  };

  void process(OutputDelta& out);
  bool step_start();
  bool step_reasoning(OutputDelta& out);
  bool step_content(OutputDelta& out);
  bool step_tool_call(OutputDelta& out, bool at_end);
  void send_listed_calls(OutputDelta& out);
  void emit(Channel& channel, std::string_view text, std::string& delta, std::string& total);
  void flush(Channel& channel, std::string& delta, std::string& total);
  void emit_content(std::string_view text, OutputDelta& out);
  void emit_reasoning(std::string_view text, OutputDelta& out);

  ToolCallFormat format_;
  std::unique_ptr<ToolSchemas> tools_;
  State state_;
  std::string pending_;            // unprocessed text (in a tool call: the block's body so far)
  bool stream_calls_ = false;
  ToolCallReader reader_;          // the current <tool_call> block
  size_t block_first_call_ = 0;    // index in result_.tool_calls of the block's first call
  std::string space_before_call_;  // restored if the call turns out invalid
  Channel content_, reasoning_;
  ParsedOutput result_;
};

}  // namespace ellm
