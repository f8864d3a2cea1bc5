#include "engine/output_parser.h"

#include <random>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/tool_parser.h"

namespace ellm {

namespace {

constexpr std::string_view kSpace = " \t\r\n";
constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";

// Length of the longest end of `text` that is a proper beginning of `tag`: text that must be
// held back because the next piece may complete the tag.
size_t partial_tag_at_end(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

std::string new_call_id() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<int> pick(0, sizeof(kAlphabet) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

}  // namespace

ToolCallFormat tool_call_format_by_name(const std::string& name) {
  if (name == "hermes" || name == "qwen3") return ToolCallFormat::hermes_json;
  if (name == "qwen3_coder" || name == "qwen3_xml") return ToolCallFormat::qwen3_coder_xml;
  if (name == "none") return ToolCallFormat::none;
  fail("--tool-call-parser", "unknown parser '" + name +
                                 "' (expected hermes, qwen3, qwen3_coder or none)");
}

ToolCallFormat detect_tool_call_format(const std::string& chat_template_source) {
  if (chat_template_source.find("<function=") != std::string::npos)
    return ToolCallFormat::qwen3_coder_xml;
  if (chat_template_source.find("<tool_call>") != std::string::npos)
    return ToolCallFormat::hermes_json;
  return ToolCallFormat::none;
}

bool prompt_opens_reasoning(std::string_view prompt) {
  size_t end = prompt.find_last_not_of(kSpace);
  return end != std::string_view::npos && prompt.substr(0, end + 1).ends_with(kThinkOpen);
}

OutputParser::OutputParser(ToolCallFormat format, bool parse_reasoning, bool starts_in_reasoning,
                           const nlohmann::json& tools)
    : format_(format), tools_(std::make_unique<ToolSchemas>(tools)) {
  state_ = !parse_reasoning      ? State::content
           : starts_in_reasoning ? State::reasoning
                                 : State::start;
  reasoning_.at_start = true;
}

OutputParser::~OutputParser() = default;
OutputParser::OutputParser(OutputParser&&) noexcept = default;
OutputParser& OutputParser::operator=(OutputParser&&) noexcept = default;

OutputDelta OutputParser::push(std::string_view text) {
  OutputDelta out;
  if (state_ == State::finished) return out;
  pending_ += text;
  process(out);
  return out;
}

OutputDelta OutputParser::finish() {
  OutputDelta out;
  switch (state_) {
    case State::finished:
      return out;
    case State::start:  // only whitespace or part of "<think>": plain text
    case State::content:
      emit_content(pending_, out);
      break;
    case State::reasoning:  // cut off while thinking: what came is still reasoning
      emit_reasoning(pending_, out);
      flush(reasoning_, out.reasoning, result_.reasoning);
      break;
    case State::tool_call:
      if (stream_calls_) step_streamed_call(out, /*at_end=*/true);
      else step_tool_call(out, /*at_end=*/true);
      break;
  }
  pending_.clear();
  if (content_.after_call) content_.held_space.clear();  // whitespace after the last call
  flush(content_, out.content, result_.content);
  state_ = State::finished;
  return out;
}

void OutputParser::process(OutputDelta& out) {
  for (bool more = true; more;) {
    switch (state_) {
      case State::start: more = step_start(); break;
      case State::reasoning: more = step_reasoning(out); break;
      case State::content: more = step_content(out); break;
      case State::tool_call:
        more = stream_calls_ ? step_streamed_call(out, /*at_end=*/false) : step_tool_call(out, /*at_end=*/false);
        break;
      case State::finished: more = false; break;
    }
  }
}

// Before any output: a reply that opens with <think> (after optional whitespace) is reasoning.
bool OutputParser::step_start() {
  size_t first = pending_.find_first_not_of(kSpace);
  if (first == std::string::npos) return false;
  std::string_view rest = std::string_view(pending_).substr(first);
  if (rest.starts_with(kThinkOpen)) {
    pending_.erase(0, first + kThinkOpen.size());
    state_ = State::reasoning;
    return true;
  }
  if (kThinkOpen.starts_with(rest)) return false;
  state_ = State::content;
  return true;
}

bool OutputParser::step_reasoning(OutputDelta& out) {
  size_t close = pending_.find(kThinkClose);
  if (close != std::string::npos) {
    emit_reasoning(std::string_view(pending_).substr(0, close), out);
    reasoning_.held_space.clear();  // the newline(s) before </think>
    pending_.erase(0, close + kThinkClose.size());
    content_.at_start = true;       // and the ones after it
    state_ = State::content;
    return true;
  }
  size_t ready = pending_.size() - partial_tag_at_end(pending_, kThinkClose);
  emit_reasoning(std::string_view(pending_).substr(0, ready), out);
  pending_.erase(0, ready);
  return false;
}

bool OutputParser::step_content(OutputDelta& out) {
  if (format_ == ToolCallFormat::none) {
    emit_content(pending_, out);
    pending_.clear();
    return false;
  }
  size_t open = pending_.find(kCallOpen);
  if (open != std::string::npos) {
    emit_content(std::string_view(pending_).substr(0, open), out);
    space_before_call_ = std::move(content_.held_space);
    content_.held_space.clear();
    pending_.erase(0, open + kCallOpen.size());
    search_from_ = 0;
    state_ = State::tool_call;
    return true;
  }
  size_t ready = pending_.size() - partial_tag_at_end(pending_, kCallOpen);
  emit_content(std::string_view(pending_).substr(0, ready), out);
  pending_.erase(0, ready);
  return false;
}

// Inside <tool_call>: wait for </tool_call>, then emit the call(s), or the text if invalid. At
// the end of generation a call missing only its closing tag is still accepted.
bool OutputParser::step_tool_call(OutputDelta& out, bool at_end) {
  size_t close = pending_.find(kCallClose, search_from_);
  if (close == std::string::npos && !at_end) {
    // Resume where a closing tag split across pieces could begin.
    search_from_ = pending_.size() - std::min(pending_.size(), kCallClose.size() - 1);
    return false;
  }
  bool closed = close != std::string::npos;
  std::string_view body = std::string_view(pending_).substr(0, closed ? close : pending_.size());

  std::vector<FunctionCall> calls;
  if (format_ == ToolCallFormat::hermes_json) {
    if (auto call = parse_hermes_tool_call(body, *tools_)) calls.push_back(std::move(*call));
  } else if (auto parsed = parse_qwen3_coder_tool_call(body, *tools_)) {
    calls = std::move(*parsed);
  }

  if (!calls.empty()) {
    for (auto& call : calls) {
      ToolCall tool_call{new_call_id(), std::move(call.name), std::move(call.arguments)};
      out.tool_calls.push_back({static_cast<int>(result_.tool_calls.size()), tool_call.id,
                                tool_call.name, tool_call.arguments});
      result_.tool_calls.push_back(std::move(tool_call));
    }
    space_before_call_.clear();
    content_.after_call = true;
  } else {  // not a call after all: the text, verbatim
    content_.held_space = std::move(space_before_call_);
    space_before_call_.clear();
    std::string text = std::string(kCallOpen).append(body);
    if (closed) text += kCallClose;
    emit_content(text, out);
  }
  pending_.erase(0, closed ? close + kCallClose.size() : pending_.size());
  state_ = State::content;
  return true;
}

namespace {

constexpr size_t kWaiting = std::string::npos, kNotACall = std::string::npos - 1;

// Matches the JSON framing of a call piece by piece: each step is matched, incomplete (the text
// ends inside it) or not matched.
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
  std::string until(char end) {  // the text before `end`, which is consumed
    if (!ok()) return {};
    size_t at = text.find(end, i);
    if (at == std::string_view::npos) return incomplete = true, std::string();
    std::string out(text.substr(i, at - i));
    i = at + 1;
    return out;
  }
};

// The end of the JSON object or array starting at `begin`, or npos when it is not complete.
size_t json_value_end(std::string_view text, size_t begin) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t j = begin; j < text.size(); ++j) {
    char c = text[j];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return j + 1;
    }
  }
  return std::string_view::npos;
}

}  // namespace

// A call streamed as it comes (stream_tool_calls): header, then argument fragments, then the
// closing tag. Text that turns out not to be a call before its header is out goes the usual way.
bool OutputParser::step_streamed_call(OutputDelta& out, bool at_end) {
  size_t end = format_ == ToolCallFormat::hermes_json ? hermes_arguments(out, at_end) : coder_arguments(out, at_end);
  if (!call_started_ && (end == kNotACall || (end == kWaiting && at_end))) return step_tool_call(out, at_end);
  if (end == kWaiting && !at_end) return false;
  size_t close = end < kNotACall ? pending_.find(kCallClose, end) : std::string::npos;
  if (close == std::string::npos && !at_end && end < kNotACall) return false;
  pending_.erase(0, close == std::string::npos ? pending_.size() : close + kCallClose.size());
  call_started_ = false, call_sent_ = 0, call_parts_ = 0;
  space_before_call_.clear();
  content_.after_call = true;
  state_ = State::content;
  return true;
}

void OutputParser::start_call(OutputDelta& out, std::string name) {
  ToolCall call{new_call_id(), std::move(name), ""};
  out.tool_calls.push_back({static_cast<int>(result_.tool_calls.size()), call.id, call.name, ""});
  result_.tool_calls.push_back(std::move(call));
  call_started_ = true;
}

void OutputParser::emit_arguments(std::string_view text, OutputDelta& out) {
  if (text.empty()) return;
  const int index = static_cast<int>(result_.tool_calls.size()) - 1;
  result_.tool_calls.back().arguments += text;
  // The header (id and name) stays a delta of its own, as vLLM sends it.
  ToolCallDelta* last = out.tool_calls.empty() ? nullptr : &out.tool_calls.back();
  if (last && last->index == index && last->id.empty()) last->arguments += text;
  else out.tool_calls.push_back({index, "", "", std::string(text)});
}

// {"name": "f", "arguments": {...}}: the arguments' JSON text as it grows. Returns where the
// call's body ends, kWaiting, or kNotACall.
size_t OutputParser::hermes_arguments(OutputDelta& out, bool at_end) {
  Scanner scan{pending_};
  for (std::string_view piece : {"{", "\"name\"", ":", "\""}) scan.space(), scan.literal(piece);
  std::string name = scan.until('"');
  for (std::string_view piece : {",", "\"arguments\"", ":"}) scan.space(), scan.literal(piece);
  if (scan.mismatch || name.find('\\') != std::string::npos) return kNotACall;
  if (scan.incomplete) return kWaiting;
  if (!call_started_) {
    if (!tools_->allows(name)) return kNotACall;
    start_call(out, name);
  }
  scan.space();
  scan.literal("{");
  if (scan.incomplete) return at_end ? scan.i : kWaiting;
  if (scan.mismatch) return scan.i;  // not an object after all: the call ends here
  const size_t begin = scan.i - 1;
  call_sent_ = std::max(call_sent_, begin);
  const size_t value_end = json_value_end(pending_, begin);
  const size_t ready = value_end == std::string::npos ? pending_.size() : value_end;
  emit_arguments(std::string_view(pending_).substr(call_sent_, ready - call_sent_), out);
  call_sent_ = ready;
  if (value_end == std::string::npos) return kWaiting;
  scan.i = value_end;
  scan.space();
  scan.literal("}");
  return scan.incomplete && !at_end ? kWaiting : scan.i;
}

// <function=f><parameter=p>value</parameter>...</function>: one fragment per parameter, its
// value converted by the parameter's type as the whole-call parser does.
size_t OutputParser::coder_arguments(OutputDelta& out, bool at_end) {
  Scanner scan{pending_};
  scan.space();
  scan.literal("<function=");
  std::string name = scan.until('>');
  if (scan.mismatch) return kNotACall;
  if (scan.incomplete) return kWaiting;
  if (!call_started_) {
    if (!tools_->allows(name)) return kNotACall;
    start_call(out, name);
  }
  scan.i = std::max(scan.i, call_sent_);
  for (;;) {
    scan.space();
    std::string_view rest = std::string_view(pending_).substr(scan.i);
    if (rest.starts_with("</function>")) {
      emit_arguments(call_parts_ == 0 ? "{}" : "}", out);
      call_sent_ = scan.i + std::string_view("</function>").size();
      return call_sent_;
    }
    const size_t value_at = rest.find('>'), close = rest.find("</parameter>");
    if (!rest.starts_with("<parameter=") || value_at == std::string_view::npos || close == std::string_view::npos)
      return rest.starts_with("<parameter=") || std::string_view("<parameter=").starts_with(rest) ||
                     std::string_view("</function>").starts_with(rest) || at_end
                 ? kWaiting : scan.i;
    std::string key(rest.substr(11, value_at - 11));
    std::string value(rest.substr(value_at + 1, close - value_at - 1));
    if (value.starts_with('\n')) value.erase(0, 1);
    if (value.ends_with('\n')) value.pop_back();
    nlohmann::ordered_json converted = convert_parameter_value(value, tools_->parameter_type(name, key));
    emit_arguments((call_parts_++ == 0 ? "{" : ", ") + nlohmann::json(key).dump() + ": " +
                       converted.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), out);
    scan.i += close + std::string_view("</parameter>").size();
    call_sent_ = scan.i;
  }
}

void OutputParser::emit(Channel& channel, std::string_view text, std::string& delta,
                        std::string& total) {
  if (channel.at_start) {
    size_t first = text.find_first_not_of(kSpace);
    if (first == std::string_view::npos) return;
    text.remove_prefix(first);
    channel.at_start = false;
  }
  size_t last = text.find_last_not_of(kSpace);
  if (last == std::string_view::npos) {
    channel.held_space += text;
    return;
  }
  flush(channel, delta, total);
  channel.after_call = false;
  delta += text.substr(0, last + 1);
  total += text.substr(0, last + 1);
  channel.held_space = text.substr(last + 1);
}

void OutputParser::flush(Channel& channel, std::string& delta, std::string& total) {
  delta += channel.held_space;
  total += channel.held_space;
  channel.held_space.clear();
}

void OutputParser::emit_content(std::string_view text, OutputDelta& out) {
  emit(content_, text, out.content, result_.content);
}

void OutputParser::emit_reasoning(std::string_view text, OutputDelta& out) {
  emit(reasoning_, text, out.reasoning, result_.reasoning);
}

}  // namespace ellm
