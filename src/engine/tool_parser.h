#pragma once
// Parsers for the body of one <tool_call>...</tool_call> block, in each model family's format.
// They return nothing when the body is not a valid call (the caller then keeps it as text).
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ellm {

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

// Qwen3 / hermes: {"name": "f", "arguments": {...}}.
std::optional<FunctionCall> parse_hermes_tool_call(std::string_view body, const ToolSchemas& tools);

// Qwen3-Coder: <function=f><parameter=p>value</parameter>...</function> (one or more functions).
// Values are converted by the parameter's schema type, as vLLM's qwen3_coder parser does.
std::optional<std::vector<FunctionCall>> parse_qwen3_coder_tool_call(std::string_view body,
                                                                      const ToolSchemas& tools);

// Converts a Qwen3-Coder parameter value (already stripped of its framing newlines) by type.
nlohmann::ordered_json convert_parameter_value(const std::string& value, const std::string& type);

}  // namespace ellm
