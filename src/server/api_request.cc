#include "server/api_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "grammar/json_schema.h"

namespace ellm {

using json = nlohmann::ordered_json;

void throw_bad_request(const std::string& message, const std::string& param) {
  throw ApiError(400, "invalid_request_error", message, param);
}

std::string schema_error_text(const SchemaError& e, const std::string& lenient) {
  std::string text = std::string(e.what()) + " (keyword '" + e.keyword + "'";
  if (e.unsupported) text += "; with " + lenient + " it is ignored";
  return text + ")";
}

json parse_body(std::string_view body, int max_depth) {
  // nlohmann's parser takes a raw NUL for the end of input, so '{...}\0junk' would pass as the
  // object before it; JSON allows NUL only escaped, so refuse it anywhere.
  if (body.find('\0') != std::string_view::npos)
    throw_bad_request("request body is not valid JSON: it contains a raw NUL byte (escape it as \\u0000)");
  // Depth scan outside strings: cheap, and keeps recursion everywhere downstream bounded.
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        throw_bad_request("request body is nested deeper than " + std::to_string(max_depth) + " levels");
    } else if (c == ']' || c == '}') depth--;
  }
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    // Say why: a second parse with exceptions names the byte and the problem (a parse_error, or
    // an out_of_range for a number beyond double such as 1e999999).
    try {
      [[maybe_unused]] json again = json::parse(body);
    } catch (const json::exception& e) {
      throw_bad_request(std::string("request body is not valid JSON: ") + e.what());
    }
    throw_bad_request("request body is not valid JSON");
  }
  if (!parsed.is_object()) throw_bad_request("request body must be a JSON object");
  return parsed;
}

namespace {

// Typed field access: null and absent are the same; a wrong type is a 400 naming the field.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> number_field(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw_bad_request(std::string("'") + name + "' must be a number", name);
  double x = v->get<double>();
  if (!std::isfinite(x)) throw_bad_request(std::string("'") + name + "' must be finite", name);
  return x;
}

std::optional<int64_t> int_field(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {  // 5.0 is fine, 5.5 is not
    double x = v->get<double>();
    if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 9e15) return static_cast<int64_t>(x);
  }
  throw_bad_request(std::string("'") + name + "' must be an integer", name);
}

std::optional<bool> bool_field(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw_bad_request(std::string("'") + name + "' must be a boolean", name);
  return v->get<bool>();
}

std::optional<std::string> string_field(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw_bad_request(std::string("'") + name + "' must be a string", name);
  return v->get<std::string>();
}

void check_range(double x, double lo, double hi, const char* name, const char* rule) {
  if (!(x >= lo && x <= hi)) throw_bad_request(std::string("'") + name + "' must be " + rule, name);
}

SamplingRequest parse_sampling(const json& body, const SamplingParams& defaults) {
  SamplingRequest r;
  r.generate.sampling = defaults;
  SamplingParams& s = r.generate.sampling;
  if (auto v = string_field(body, "model")) r.model = *v;
  if (auto v = bool_field(body, "stream")) r.stream = *v;
  if (const json* opts = field(body, "stream_options")) {
    if (!opts->is_object()) throw_bad_request("'stream_options' must be an object", "stream_options");
    if (auto v = bool_field(*opts, "include_usage")) r.include_usage = *v;
    // vLLM: every chunk carries the usage so far; only together with include_usage.
    if (auto v = bool_field(*opts, "continuous_usage_stats")) r.continuous_usage = *v && r.include_usage;
  }
  if (auto n = int_field(body, "n")) {
    if (*n < 1 || *n > kMaxChoices)
      throw_bad_request("'n' must be between 1 and " + std::to_string(kMaxChoices), "n");
    r.n = static_cast<int>(*n);
  }
  if (auto n = int_field(body, "best_of"); n && *n != 1)
    throw_bad_request("'best_of' must be 1", "best_of");

  if (auto v = number_field(body, "temperature")) {
    check_range(*v, 0, 100, "temperature", "between 0 and 100");
    s.temperature = static_cast<float>(*v);
  }
  if (auto v = number_field(body, "top_p")) {
    if (!(*v > 0 && *v <= 1)) throw_bad_request("'top_p' must be in (0, 1]", "top_p");
    s.top_p = static_cast<float>(*v);
  }
  if (auto v = int_field(body, "top_k")) {
    if (*v < -1) throw_bad_request("'top_k' must be -1 (off), 0 (off) or positive", "top_k");
    s.top_k = static_cast<int>(std::min<int64_t>(*v, std::numeric_limits<int>::max()));
  }
  if (auto v = number_field(body, "min_p")) {
    check_range(*v, 0, 1, "min_p", "between 0 and 1");
    s.min_p = static_cast<float>(*v);
  }
  if (auto v = int_field(body, "seed")) s.seed = static_cast<uint64_t>(*v);
  if (auto v = number_field(body, "presence_penalty")) {
    check_range(*v, -2, 2, "presence_penalty", "between -2 and 2");
    s.presence_penalty = static_cast<float>(*v);
  }
  if (auto v = number_field(body, "frequency_penalty")) {
    check_range(*v, -2, 2, "frequency_penalty", "between -2 and 2");
    s.frequency_penalty = static_cast<float>(*v);
  }
  if (auto v = number_field(body, "repetition_penalty")) {
    if (!(*v > 0 && *v <= 100)) throw_bad_request("'repetition_penalty' must be in (0, 100]", "repetition_penalty");
    s.repetition_penalty = static_cast<float>(*v);
  }

  // max_completion_tokens is the newer OpenAI name; it wins when both are given.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (auto v = int_field(body, name)) {
      if (*v < 1) throw_bad_request(std::string("'") + name + "' must be at least 1, got " + std::to_string(*v), name);
      r.generate.max_tokens = *v;
    }
  }
  if (const json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      r.generate.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& x : *stop) {
        if (!x.is_string()) throw_bad_request("'stop' must be a string or a list of strings", "stop");
        r.generate.stop.push_back(x.get<std::string>());
      }
    } else {
      throw_bad_request("'stop' must be a string or a list of strings", "stop");
    }
    for (const std::string& x : r.generate.stop)
      if (x.empty()) throw_bad_request("'stop' strings must not be empty", "stop");
  }
  if (const json* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array()) throw_bad_request("'stop_token_ids' must be a list of integers", "stop_token_ids");
    for (const json& x : *ids) {
      if (!x.is_number_integer()) throw_bad_request("'stop_token_ids' must be a list of integers", "stop_token_ids");
      int64_t id = x.get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max())
        throw_bad_request("'stop_token_ids' holds an id outside the vocabulary", "stop_token_ids");
      r.generate.stop_token_ids.push_back(static_cast<int32_t>(id));
    }
  }
  if (const json* format = field(body, "response_format")) r.json_grammar = parse_response_format(*format);
  if (auto v = bool_field(body, "ignore_eos")) r.generate.ignore_eos = *v;
  if (auto v = bool_field(body, "skip_special_tokens")) r.generate.skip_special_tokens = *v;
  // ellm extension: false makes the request prefill from scratch (benchmarks, cold-run checks).
  if (auto v = bool_field(body, "session_cache")) r.generate.use_session_cache = *v;
  // ellm extension: this request's speculative decoding ("ngram", "mtp", "draft", "none") and
  // how many tokens it proposes per pass at most; the engine checks them against the server's.
  if (auto v = string_field(body, "speculative")) r.generate.speculative = *v;
  if (auto v = int_field(body, "num_speculative_tokens")) {
    if (*v < 0) throw_bad_request("'num_speculative_tokens' must not be negative", "num_speculative_tokens");
    r.generate.num_speculative_tokens = *v;
  }
  return r;
}

}  // namespace

std::shared_ptr<const Grammar> parse_response_format(const json& format) {
  const char* param = "response_format";
  if (!format.is_object() || !format.contains("type") || !format["type"].is_string())
    throw_bad_request("'response_format' must be an object with a string 'type'", param);
  const std::string type = format["type"];
  if (type == "text") return nullptr;
  if (type == "json_object") return json_object_grammar();
  if (type != "json_schema")
    throw_bad_request("'response_format.type' must be text, json_object or json_schema", param);
  const json* spec = field(format, "json_schema");
  if (!spec || !spec->is_object()) throw_bad_request("'response_format.json_schema' must be an object", param);
  const json* strict = field(*spec, "strict");
  if (strict && !strict->is_boolean()) throw_bad_request("'response_format.json_schema.strict' must be a boolean", param);
  const json* schema = field(*spec, "schema");
  if (!schema) throw_bad_request("'response_format.json_schema.schema' is required", param);
  try {
    // As OpenAI: strict is false unless given.
    return compile_json_schema(nlohmann::json(*schema), strict && strict->get<bool>());
  } catch (const SchemaError& e) {
    throw_bad_request("response_format.json_schema: " + schema_error_text(e, "'strict': false"), param);
  }
}

ChatRequest parse_chat_request(const json& body, const SamplingParams& defaults) {
  ChatRequest r;
  static_cast<SamplingRequest&>(r) = parse_sampling(body, defaults);

  const json* messages = field(body, "messages");
  if (!messages) throw_bad_request("'messages' is required", "messages");
  if (!messages->is_array() || messages->empty())
    throw_bad_request("'messages' must be a non-empty list of messages", "messages");
  for (const json& m : *messages) {
    if (!m.is_object()) throw_bad_request("each message must be an object", "messages");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      throw_bad_request("each message needs a string 'role'", "messages");
    auto content = m.find("content");
    if (content != m.end() && !content->is_null() && !content->is_string() && !content->is_array())
      throw_bad_request("message 'content' must be a string or a list of parts", "messages");
  }
  r.messages = *messages;

  if (const json* tools = field(body, "tools")) {
    if (!tools->is_array()) throw_bad_request("'tools' must be a list", "tools");
    for (const json& t : *tools) {
      const json* fn = t.is_object() ? field(t, "function") : nullptr;
      if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
        throw_bad_request("each tool needs 'function' with a string 'name'", "tools");
    }
    r.tools = *tools;
  }
  if (const json* choice = field(body, "tool_choice")) {
    if (choice->is_string()) {
      r.tool_choice = choice->get<std::string>();
      if (r.tool_choice != "auto" && r.tool_choice != "none" && r.tool_choice != "required")
        throw_bad_request("'tool_choice' must be auto, none, required or a named function", "tool_choice");
    } else if (choice->is_object() && choice->contains("function") && (*choice)["function"].is_object() &&
               (*choice)["function"].contains("name") && (*choice)["function"]["name"].is_string()) {
      r.tool_choice = "function";  // apart from the name, which may well be "none"
      r.forced_function = (*choice)["function"]["name"].get<std::string>();
    } else {
      throw_bad_request("'tool_choice' must be auto, none, required or a named function", "tool_choice");
    }
  }
  if (auto v = bool_field(body, "parallel_tool_calls")) r.parallel_tool_calls = *v;
  if (const json* kwargs = field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) throw_bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    r.template_kwargs = *kwargs;
  }
  // As vLLM does: the template's own variable (Qwen3.8's: low, medium, xhigh); a value the
  // template refuses is its error, a 400.
  if (const json* effort = field(body, "reasoning_effort"); effort && !effort->is_null()) {
    if (!effort->is_string()) throw_bad_request("'reasoning_effort' must be a string", "reasoning_effort");
    if (!r.template_kwargs.contains("reasoning_effort")) r.template_kwargs["reasoning_effort"] = *effort;
  }

  // Chat: logprobs is a bool, top_logprobs the number of alternatives.
  if (auto v = bool_field(body, "logprobs")) r.logprobs = *v;
  if (auto v = int_field(body, "top_logprobs")) {
    if (*v < 0 || *v > 20) throw_bad_request("'top_logprobs' must be between 0 and 20", "top_logprobs");
    if (!r.logprobs) throw_bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    r.generate.sampling.top_logprobs = static_cast<int>(*v);
  } else if (r.logprobs) {
    r.generate.sampling.top_logprobs = 0;
  }
  return r;
}

TextRequest parse_completion_request(const json& body, const SamplingParams& defaults) {
  TextRequest r;
  static_cast<SamplingRequest&>(r) = parse_sampling(body, defaults);

  const json* prompt = field(body, "prompt");
  if (!prompt) throw_bad_request("'prompt' is required", "prompt");
  const json* p = prompt;
  // A list holding one prompt is the same as that prompt; more than one would need n choices.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
  } else if (p->is_array() && !p->empty() && std::all_of(p->begin(), p->end(), [](const json& x) { return x.is_number_integer(); })) {
    r.prompt_is_ids = true;
    for (const json& x : *p) {
      int64_t id = x.get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max())
        throw_bad_request("'prompt' holds a token id outside the vocabulary", "prompt");
      r.prompt_ids.push_back(static_cast<int32_t>(id));
    }
  } else if (p->is_array() && p->size() > 1) {
    throw_bad_request("'prompt' must be one prompt: batches of prompts are not supported", "prompt");
  } else {
    throw_bad_request("'prompt' must be a string or a non-empty list of token ids", "prompt");
  }
  if (!r.prompt_is_ids && r.prompt_text.empty()) throw_bad_request("'prompt' must not be empty", "prompt");

  // Completions: logprobs is the number of alternatives.
  if (const json* lp = field(body, "logprobs")) {
    if (lp->is_boolean()) {  // tolerated: some clients send the chat form
      r.logprobs = lp->get<bool>();
      if (r.logprobs) r.generate.sampling.top_logprobs = 0;
    } else {
      auto v = int_field(body, "logprobs");
      if (*v < 0 || *v > 20) throw_bad_request("'logprobs' must be between 0 and 20", "logprobs");
      r.logprobs = true;
      r.generate.sampling.top_logprobs = static_cast<int>(*v);
    }
  }
  if (auto v = bool_field(body, "echo")) r.echo = *v;
  return r;
}

}  // namespace ellm
