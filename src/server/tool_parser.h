#pragma once
// Reads the body of one <tool_call>...</tool_call> block, in each model family's format, as it
// grows. The streamed and the whole replies are built from the same reading, so the argument
// fragments a stream sends add up to the arguments the whole reply reports.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ellm {

enum class ToolCallFormat { none, hermes_json, qwen3_coder_xml };

// The functions a request offers, from its OpenAI `tools` array.
class ToolSchemas {
 public:
  explicit ToolSchemas(const nlohmann::json& tools);  // null / not an array = no tools
  // True when `name` may be called: it is one of the tools, or the request named none.
  bool allows(const std::string& name) const;
  // The JSON-schema `type` of a function's parameter ("string" when unknown).
  std::string parameter_type(const std::string& function, const std::string& parameter) const;

 private:
  nlohmann::json functions_;  // name -> the function's `parameters.properties` object
};

struct FunctionCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
};

// One block's body, fed as it grows (`body` is the text after <tool_call> so far, the same text
// with more at its end at every call of read()).
//
// Qwen3 / hermes: {"name": "f", "arguments": {...}}. Written in that order, the call is listed
// once its name is a declared tool and its arguments object has begun, and its arguments are the
// object's text as the model writes it, growing with it. Any other layout ("parameters", the
// arguments as a JSON string, the keys swapped) is parsed whole at the end of the block; its
// arguments are then the compact JSON of the object.
//
// Qwen3-Coder: <function=f><parameter=p>value</parameter>...</function>, one or more functions.
// A call is listed at its <function=f>; its arguments grow by a parameter at a time, each value
// converted by the parameter's schema type, as vLLM's qwen3_coder parser does.
//
// A listed call's arguments only grow. A block that goes wrong after a call was listed ends
// malformed with its listed calls as they were (a stream has sent them; a whole reply drops the
// block's calls and keeps its text).
class ToolCallReader {
 public:
  enum class Status { reading, complete, malformed };

  ToolCallReader(ToolCallFormat format, const ToolSchemas* tools) : format_(format), tools_(tools) {}
  // at_end: no more text will come (a call missing only its closing tag is still complete).
  Status read(std::string_view body, bool at_end);
  const std::vector<FunctionCall>& calls() const { return calls_; }
  // Once not reading: the length of the block's body and whether </tool_call> follows it.
  size_t body_end() const { return end_; }
  bool closed() const { return closed_; }

 private:
  enum class Phase { header, arguments, tail, whole, broken };
  enum class Step { done, waiting, bad };

  std::optional<size_t> block_end(std::string_view body, bool at_end);
  Status read_broken(std::string_view body, bool at_end);
  Status end_block(Status status, size_t end, bool closed);
  Status read_hermes(std::string_view body, bool at_end);
  void read_hermes_header(std::string_view body, bool at_end);
  Status read_hermes_arguments(std::string_view body, bool at_end);
  Status read_hermes_end(std::string_view body, bool at_end);
  Status read_coder(std::string_view body, bool at_end);
  Step read_coder_parameter(std::string_view block, bool block_ends);

  ToolCallFormat format_;
  const ToolSchemas* tools_;
  std::vector<FunctionCall> calls_;
  Status status_ = Status::reading;
  Phase phase_ = Phase::header;
  size_t end_ = 0;
  bool closed_ = false;
  size_t pos_ = 0;           // the body is read up to here
  size_t close_from_ = 0;    // where </tool_call> is searched from
  size_t close_seen_ = 0;    // ... and where that search may resume
  size_t value_seen_ = 0;    // Qwen3-Coder: where the search for </parameter> may resume
  // Qwen3 arguments object: where it began and the scan's state.
  size_t arguments_begin_ = 0;
  int depth_ = 0;
  bool in_string_ = false, escaped_ = false;
  // Qwen3-Coder: inside <function=...>, and its parameters so far.
  bool in_function_ = false;
  int parameters_ = 0;
};

// Qwen3 / hermes, the whole body at once: {"name": "f", "arguments": {...}} in any layout.
std::optional<FunctionCall> parse_hermes_tool_call(std::string_view body, const ToolSchemas& tools);

// Converts a Qwen3-Coder parameter value (already stripped of its framing newlines) by type.
nlohmann::ordered_json convert_parameter_value(const std::string& value, const std::string& type);

}  // namespace ellm
