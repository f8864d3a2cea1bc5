#include "server/tool_parser.h"

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

namespace {

constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kFunction = "<function=", kFunctionEnd = "</function>";
constexpr std::string_view kParameter = "<parameter=", kParameterEnd = "</parameter>";
// {"name": ..., "arguments": { must fit in this many bytes to be streamed (the header is
// scanned afresh as the text grows).
constexpr size_t kMaxHeader = 512;

// Matches the JSON framing of a Qwen3 call piece by piece: each step is matched, incomplete
// (the text ends inside it) or not matched.
struct Scanner {
  std::string_view text;
  size_t i = 0;
  bool incomplete = false, mismatch = false;

  bool ok() const { return !incomplete && !mismatch; }
  void space() {
    while (i < text.size() && kSpace.find(text[i]) != std::string_view::npos) ++i;
  }
  void literal(std::string_view s) {
    if (!ok()) return;
    size_t n = std::min(s.size(), text.size() - i);
    if (text.substr(i, n) != s.substr(0, n)) mismatch = true;
    else if (n < s.size()) incomplete = true;
    else i += n;
  }
  std::string name() {  // a string without escapes or markup, up to its closing quote
    if (!ok()) return {};
    size_t at = text.find_first_of("\"\\<\n", i);
    if (at == std::string_view::npos) return incomplete = true, std::string();
    if (text[at] != '"') return mismatch = true, std::string();
    std::string out(text.substr(i, at - i));
    i = at + 1;
    return out;
  }
};

// "<tag=NAME>" at the start of `text`: NAME trimmed and the tag's length.
struct TagName {
  enum State { ok, waiting, bad } state;
  std::string name;
  size_t size = 0;
};

TagName read_tag_name(std::string_view text, std::string_view tag, bool block_ends) {
  size_t close = text.find_first_of(">\n<", tag.size());
  if (close == std::string_view::npos) return {block_ends ? TagName::bad : TagName::waiting, {}, 0};
  std::string_view name = trim(text.substr(tag.size(), close - tag.size()));
  if (text[close] != '>' || name.empty()) return {TagName::bad, {}, 0};
  return {TagName::ok, std::string(name), close + 1};
}

size_t skip_space(std::string_view text, size_t pos) {
  pos = text.find_first_not_of(kSpace, pos);
  return pos == std::string_view::npos ? text.size() : pos;
}

// The compact JSON of a text, or nothing when it is not JSON.
std::string compact(std::string_view text) {
  auto value = parse_json(text);
  return value ? to_text(*value) : std::string();
}

}  // namespace

ToolCallReader::Status ToolCallReader::read(std::string_view body, bool at_end) {
  if (status_ != Status::reading) return status_;
  if (phase_ == Phase::broken) return read_broken(body, at_end);
  return format_ == ToolCallFormat::qwen3_coder_xml ? read_coder(body, at_end) : read_hermes(body, at_end);
}

// Where the block ends once that is known: at its closing tag (searched from close_from_), or at
// the end of the output.
std::optional<size_t> ToolCallReader::block_end(std::string_view body, bool at_end) {
  size_t close = body.find(kCallClose, std::max(close_from_, close_seen_));
  closed_ = close != std::string_view::npos;
  if (closed_) return close;
  close_seen_ = body.size() - std::min(body.size(), kCallClose.size() - 1);
  if (at_end) return body.size();
  return std::nullopt;
}

ToolCallReader::Status ToolCallReader::read_broken(std::string_view body, bool at_end) {
  phase_ = Phase::broken;
  auto end = block_end(body, at_end);
  return end ? end_block(Status::malformed, *end, closed_) : Status::reading;
}

ToolCallReader::Status ToolCallReader::end_block(Status status, size_t end, bool closed) {
  status_ = status;
  end_ = end;
  closed_ = closed;
  return status;
}

ToolCallReader::Status ToolCallReader::read_hermes(std::string_view body, bool at_end) {
  if (phase_ == Phase::header) read_hermes_header(body, at_end);
  if (phase_ == Phase::header) return Status::reading;
  if (phase_ == Phase::arguments) {
    Status status = read_hermes_arguments(body, at_end);
    if (phase_ == Phase::arguments) return status;
  }
  return read_hermes_end(body, at_end);
}

// {"name": "f", "arguments": { -> the call is listed; anything else is parsed whole at the end.
void ToolCallReader::read_hermes_header(std::string_view body, bool at_end) {
  Scanner scan{body.substr(0, std::min(body.size(), kMaxHeader))};
  for (std::string_view piece : {"{", "\"name\"", ":", "\""}) scan.space(), scan.literal(piece);
  std::string name = scan.name();
  for (std::string_view piece : {",", "\"arguments\"", ":", "{"}) scan.space(), scan.literal(piece);
  if (scan.incomplete && !at_end && body.size() < kMaxHeader) return;
  if (!scan.ok() || name.empty() || !tools_->allows(name)) {
    phase_ = Phase::whole;
    return;
  }
  calls_.push_back({std::move(name), "{"});
  arguments_begin_ = scan.i - 1;
  pos_ = scan.i;
  depth_ = 1;
  phase_ = Phase::arguments;
}

// The arguments object, as far as it is written: its text grows until its braces balance.
ToolCallReader::Status ToolCallReader::read_hermes_arguments(std::string_view body, bool at_end) {
  while (pos_ < body.size() && depth_ > 0) {
    const char c = body[pos_];
    if (!in_string_ && c == '<') {  // never JSON: perhaps the block's end, the object unfinished
      std::string_view rest = body.substr(pos_);
      if (rest.starts_with(kCallClose)) break;
      if (kCallClose.starts_with(rest) && !at_end) break;
    }
    if (in_string_) {
      if (escaped_) escaped_ = false;
      else if (c == '\\') escaped_ = true;
      else if (c == '"') in_string_ = false;
    } else if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      --depth_;
    }
    ++pos_;
  }
  std::string& arguments = calls_.back().arguments;
  const size_t have = arguments_begin_ + arguments.size();
  arguments.append(body.substr(have, pos_ - have));
  if (depth_ == 0) {
    phase_ = Phase::tail;
    close_from_ = pos_;
    return Status::reading;
  }
  if (body.substr(pos_).starts_with(kCallClose)) return end_block(Status::malformed, pos_, true);
  return at_end ? end_block(Status::malformed, body.size(), false) : Status::reading;
}

// After the arguments object (tail), or for a call in another layout (whole): the block's end,
// then the whole body must be a valid call.
ToolCallReader::Status ToolCallReader::read_hermes_end(std::string_view body, bool at_end) {
  auto end = block_end(body, at_end);
  if (!end) return Status::reading;
  auto call = parse_hermes_tool_call(body.substr(0, *end), *tools_);
  if (phase_ == Phase::whole) {
    if (call) calls_.push_back(std::move(*call));
    return end_block(call ? Status::complete : Status::malformed, *end, closed_);
  }
  const FunctionCall& listed = calls_.back();
  const bool same = call && call->name == listed.name && call->arguments == compact(listed.arguments);
  return end_block(same ? Status::complete : Status::malformed, *end, closed_);
}

// Qwen3-Coder: the block ends at the first </tool_call> (a value cannot hold one).
ToolCallReader::Status ToolCallReader::read_coder(std::string_view body, bool at_end) {
  auto end = block_end(body, at_end);
  const bool ends = end.has_value();
  const std::string_view block = body.substr(0, end.value_or(body.size()));
  for (;;) {
    pos_ = skip_space(block, pos_);
    const std::string_view rest = block.substr(pos_);
    auto may_become = [&](std::string_view tag) { return !ends && tag.starts_with(rest); };
    if (!in_function_) {
      if (rest.empty()) return ends ? end_block(calls_.empty() ? Status::malformed : Status::complete, *end, closed_) : Status::reading;
      if (!rest.starts_with(kFunction))
        return may_become(kFunction) || may_become(kCallClose) ? Status::reading : read_broken(body, at_end);
      TagName name = read_tag_name(rest, kFunction, ends);
      if (name.state == TagName::waiting) return Status::reading;
      if (name.state == TagName::bad || !tools_->allows(name.name)) return read_broken(body, at_end);
      calls_.push_back({std::move(name.name), "{"});
      in_function_ = true, parameters_ = 0, pos_ += name.size;
    } else if (rest.starts_with(kFunctionEnd)) {
      calls_.back().arguments += '}';
      in_function_ = false, pos_ += kFunctionEnd.size();
    } else if (rest.starts_with(kParameter)) {
      Step step = read_coder_parameter(block, ends);
      if (step == Step::waiting) return Status::reading;
      if (step == Step::bad) return read_broken(body, at_end);
    } else {
      return may_become(kParameter) || may_become(kFunctionEnd) ? Status::reading : read_broken(body, at_end);
    }
  }
}

// <parameter=KEY>VALUE</parameter> at pos_, added to the call's arguments. Models sometimes omit
// </parameter>: once the block's end is known, such a value runs to the next tag.
ToolCallReader::Step ToolCallReader::read_coder_parameter(std::string_view block, bool block_ends) {
  TagName key = read_tag_name(block.substr(pos_), kParameter, block_ends);
  if (key.state != TagName::ok) return key.state == TagName::waiting ? Step::waiting : Step::bad;
  const size_t value_begin = pos_ + key.size;
  size_t value_end = block.find(kParameterEnd, std::max(value_begin, value_seen_));
  size_t next = value_end + kParameterEnd.size();
  if (value_end == std::string_view::npos) {
    if (!block_ends) {
      value_seen_ = block.size() - std::min(block.size(), kParameterEnd.size() - 1);
      return Step::waiting;
    }
    value_end = next = std::min(block.find(kParameter, value_begin), block.find(kFunctionEnd, value_begin));
    if (value_end == std::string_view::npos) return Step::bad;
  }
  std::string_view value = block.substr(value_begin, value_end - value_begin);
  if (value.starts_with('\n')) value.remove_prefix(1);
  if (value.ends_with('\n')) value.remove_suffix(1);
  FunctionCall& call = calls_.back();
  if (parameters_++ > 0) call.arguments += ',';
  call.arguments += to_text(ordered_json(key.name)) + ':' +
                    to_text(convert_parameter_value(std::string(value), tools_->parameter_type(call.name, key.name)));
  pos_ = next;
  value_seen_ = 0;
  return Step::done;
}

}  // namespace ellm
