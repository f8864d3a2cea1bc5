#include "engine/tool_parser.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace ellm {

using ordered_json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kSpace = " \t\r\n";

std::string_view trim(std::string_view s) {
  size_t begin = s.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(kSpace) - begin + 1);
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool starts_with_any(const std::string& s, std::initializer_list<std::string_view> prefixes) {
  for (std::string_view p : prefixes)
    if (s.starts_with(p)) return true;
  return false;
}

// Invalid UTF-8 (possible in raw model text) must not make dump() throw.
std::string to_text(const ordered_json& value) {
  return value.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

std::optional<ordered_json> parse_json(std::string_view text) {
  // nlohmann's parser takes a raw NUL for the end of input: '{...}\0junk' is not JSON.
  if (text.find('\0') != std::string_view::npos) return std::nullopt;
  ordered_json value = ordered_json::parse(text.begin(), text.end(), nullptr, false);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

std::optional<int64_t> parse_integer(std::string_view s) {
  if (s.starts_with('+')) s.remove_prefix(1);
  int64_t value = 0;
  auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || error != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return value;
}

std::optional<ordered_json> parse_number(std::string_view s) {
  if (s.empty() || s.find_first_not_of("0123456789+-.eE") != std::string_view::npos)
    return std::nullopt;
  std::string text(s);
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(value)) return std::nullopt;
  // Like vLLM: a number without a fractional part is an integer (5.0 -> 5).
  if (value == std::trunc(value) && std::fabs(value) < 9.007199254740992e15)
    return ordered_json(static_cast<int64_t>(value));
  return ordered_json(value);
}

}  // namespace

ToolSchemas::ToolSchemas(const nlohmann::json& tools) : functions_(nlohmann::json::object()) {
  if (!tools.is_array()) return;
  for (const auto& tool : tools) {
    if (!tool.is_object()) continue;
    const auto& function = tool.contains("function") && tool["function"].is_object()
                               ? tool["function"] : tool;
    if (!function.contains("name") || !function["name"].is_string()) continue;
    nlohmann::json properties = nlohmann::json::object();
    if (function.contains("parameters") && function["parameters"].is_object()) {
      const auto& parameters = function["parameters"];
      if (parameters.contains("properties") && parameters["properties"].is_object())
        properties = parameters["properties"];
    }
    functions_[function["name"].get<std::string>()] = std::move(properties);
  }
}

bool ToolSchemas::allows(const std::string& name) const {
  return functions_.empty() || functions_.contains(name);
}

std::string ToolSchemas::parameter_type(const std::string& function,
                                        const std::string& parameter) const {
  auto f = functions_.find(function);
  if (f == functions_.end()) return "string";
  auto p = f->find(parameter);
  if (p == f->end() || !p->is_object() || !p->contains("type")) return "string";
  const auto& type = (*p)["type"];
  if (type.is_string()) return type.get<std::string>();
  if (type.is_array())  // ["integer", "null"]: the first type that is not null
    for (const auto& t : type)
      if (t.is_string() && t.get<std::string>() != "null") return t.get<std::string>();
  return "string";
}

std::optional<FunctionCall> parse_hermes_tool_call(std::string_view body,
                                                   const ToolSchemas& tools) {
  auto call = parse_json(body);
  if (!call || !call->is_object() || !call->contains("name") || !(*call)["name"].is_string())
    return std::nullopt;
  std::string name = (*call)["name"].get<std::string>();
  if (name.empty() || !tools.allows(name)) return std::nullopt;

  ordered_json arguments = ordered_json::object();
  const char* key = call->contains("arguments") ? "arguments" : "parameters";
  if (call->contains(key)) {
    arguments = (*call)[key];
    if (arguments.is_string()) {  // arguments already encoded as a JSON string
      auto decoded = parse_json(arguments.get<std::string>());
      if (!decoded) return std::nullopt;
      arguments = std::move(*decoded);
    }
    if (!arguments.is_object()) return std::nullopt;
  }
  return FunctionCall{std::move(name), to_text(arguments)};
}

ordered_json convert_parameter_value(const std::string& value, const std::string& schema_type) {
  if (lower(value) == "null") return nullptr;
  std::string type = lower(trim(schema_type));
  std::string_view text = trim(value);
  if (type == "string" || type == "str" || type == "text" || type == "varchar" ||
      type == "char" || type == "enum")
    return value;
  if (starts_with_any(type, {"int", "uint", "long", "short", "unsigned"})) {
    if (auto number = parse_integer(text)) return *number;
    return value;
  }
  if (starts_with_any(type, {"num", "float", "double"})) {
    if (auto number = parse_number(text)) return *number;
    return value;
  }
  if (type == "boolean" || type == "bool" || type == "binary") {
    std::string word = lower(text);
    if (word == "true" || word == "false") return word == "true";
    return value;
  }
  // object, array, dict..., list... and types we do not know: JSON if it is JSON.
  if (auto parsed = parse_json(text)) return *parsed;
  return value;
}

std::optional<std::vector<FunctionCall>> parse_qwen3_coder_tool_call(std::string_view body,
                                                                      const ToolSchemas& tools) {
  constexpr std::string_view kFunction = "<function=", kFunctionEnd = "</function>";
  constexpr std::string_view kParameter = "<parameter=", kParameterEnd = "</parameter>";
  std::vector<FunctionCall> calls;
  size_t pos = 0;
  auto skip_space = [&] {
    pos = body.find_first_not_of(kSpace, pos);
    if (pos == std::string_view::npos) pos = body.size();
  };
  auto at = [&](std::string_view tag) { return body.substr(pos).starts_with(tag); };
  // "<tag=NAME>": the trimmed NAME, or nothing when malformed.
  auto read_name = [&](std::string_view tag) -> std::optional<std::string> {
    size_t close = body.find('>', pos + tag.size());
    if (close == std::string_view::npos) return std::nullopt;
    std::string_view name = trim(body.substr(pos + tag.size(), close - pos - tag.size()));
    if (name.empty() || name.find_first_of("<\n") != std::string_view::npos) return std::nullopt;
    pos = close + 1;
    return std::string(name);
  };

  for (skip_space(); pos < body.size(); skip_space()) {
    if (!at(kFunction)) return std::nullopt;
    auto name = read_name(kFunction);
    if (!name || !tools.allows(*name)) return std::nullopt;
    ordered_json arguments = ordered_json::object();
    for (skip_space(); !at(kFunctionEnd); skip_space()) {
      if (!at(kParameter)) return std::nullopt;
      auto parameter = read_name(kParameter);
      if (!parameter) return std::nullopt;
      // The value runs to </parameter>; models sometimes omit it before the next tag.
      size_t end = body.find(kParameterEnd, pos), next = end;
      if (end == std::string_view::npos) {
        end = std::min(body.find(kParameter, pos), body.find(kFunctionEnd, pos));
        if (end == std::string_view::npos) return std::nullopt;
        next = end;
      } else {
        next = end + kParameterEnd.size();
      }
      std::string_view value = body.substr(pos, end - pos);
      if (value.starts_with('\n')) value.remove_prefix(1);
      if (value.ends_with('\n')) value.remove_suffix(1);
      arguments[*parameter] =
          convert_parameter_value(std::string(value), tools.parameter_type(*name, *parameter));
      pos = next;
    }
    pos += kFunctionEnd.size();
    calls.push_back({std::move(*name), to_text(arguments)});
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

}  // namespace ellm
