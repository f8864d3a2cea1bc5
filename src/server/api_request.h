#pragma once
// OpenAI/vLLM request bodies -> what the chat template and the engine need. Pure functions: every
// check throws ApiError carrying the HTTP status and the offending field, so a bad request is
// answered with a 4xx and never reaches the engine.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "grammar/json_schema.h"

namespace ellm {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, const std::string& message, std::string param = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)) {}
  int status;
  std::string type;   // invalid_request_error, authentication_error, not_found_error, ...
  std::string param;  // the request field at fault, "" when none
};

[[noreturn]] void throw_bad_request(const std::string& message, const std::string& param = "");
// A schema the compiler refused, for a 400: the message, the keyword, and for a keyword that
// could not be enforced, that `lenient` (how the request asks for best effort) would ignore it.
std::string schema_error_text(const SchemaError& e, const std::string& lenient);

// Parses a request body. Rejects nesting deeper than max_depth before parsing, since the chat
// template and the JSON writer recurse; nlohmann rejects invalid UTF-8 and raw control bytes.
nlohmann::ordered_json parse_body(std::string_view body, int max_depth = 64);

// Fields shared by /v1/chat/completions and /v1/completions.
struct SamplingRequest {
  std::string model;  // "" = not given
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool continuous_usage = false;  // stream_options.continuous_usage_stats (with include_usage)
  bool logprobs = false;
  int n = 1;                   // choices from one prompt (each its own sampling stream)
  GenerateRequest generate;    // everything but the prompt; max_tokens -1 when not given
  std::shared_ptr<const Grammar> json_grammar;  // response_format json_object / json_schema
};

constexpr int kMaxChoices = 16;

struct ChatRequest : SamplingRequest {
  nlohmann::ordered_json messages;                                   // non-empty array of objects
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  std::string tool_choice = "auto";  // auto | none | required | function (forced_function)
  std::string forced_function;       // tool_choice {"type": "function", ...}: its name
  bool parallel_tool_calls = true;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
};

struct TextRequest : SamplingRequest {
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  bool echo = false;
};

// response_format -> its grammar (null for "text"); an invalid or unsupported schema is a 400
// naming the keyword.
std::shared_ptr<const Grammar> parse_response_format(const nlohmann::ordered_json& format);

// `defaults` come from generation_config.json; the request overrides field by field.
ChatRequest parse_chat_request(const nlohmann::ordered_json& body, const SamplingParams& defaults);
TextRequest parse_completion_request(const nlohmann::ordered_json& body, const SamplingParams& defaults);

}  // namespace ellm
