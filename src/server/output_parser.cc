#include "server/output_parser.h"

#include <random>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "server/tool_parser.h"

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
    : format_(format), tools_(std::make_unique<ToolSchemas>(tools)), reader_(format, tools_.get()) {
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

OutputDelta OutputParser::push(std::string_view text, bool last) {
  OutputDelta out = push(text);
  if (!last) return out;
  OutputDelta rest = finish();
  out.content += rest.content;
  out.reasoning += rest.reasoning;
  for (ToolCallDelta& t : rest.tool_calls) out.tool_calls.push_back(std::move(t));
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
      step_tool_call(out, /*at_end=*/true);
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
      case State::tool_call: more = step_tool_call(out, /*at_end=*/false); break;
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
    reader_ = ToolCallReader(format_, tools_.get());
    block_first_call_ = result_.tool_calls.size();
    state_ = State::tool_call;
    return true;
  }
  size_t ready = pending_.size() - partial_tag_at_end(pending_, kCallOpen);
  emit_content(std::string_view(pending_).substr(0, ready), out);
  pending_.erase(0, ready);
  return false;
}

// Inside <tool_call>: the reader takes the block as it grows. Streaming, each call goes out as
// soon as the reader lists it (a declared tool's name), then its arguments as they grow; a block
// that goes wrong after that keeps what went out, so a client never sees a call taken back.
// Otherwise the block's calls go out whole once it is complete. A block with no call sent that
// is not valid is the text it was, verbatim.
bool OutputParser::step_tool_call(OutputDelta& out, bool at_end) {
  const ToolCallReader::Status status = reader_.read(pending_, at_end);
  if (stream_calls_) send_listed_calls(out);
  if (status == ToolCallReader::Status::reading) return false;

  const size_t end = reader_.body_end();
  const bool any_sent = result_.tool_calls.size() > block_first_call_;
  if (status == ToolCallReader::Status::complete && !stream_calls_) {
    for (const FunctionCall& call : reader_.calls()) {
      ToolCall tool_call{new_call_id(), call.name, call.arguments};
      out.tool_calls.push_back({static_cast<int>(result_.tool_calls.size()), tool_call.id, tool_call.name, tool_call.arguments});
      result_.tool_calls.push_back(std::move(tool_call));
    }
  } else if (!any_sent) {
    content_.held_space = std::move(space_before_call_);
    std::string text = std::string(kCallOpen).append(pending_, 0, end);
    if (reader_.closed()) text += kCallClose;
    emit_content(text, out);
  }
  if (result_.tool_calls.size() > block_first_call_) content_.after_call = true;
  space_before_call_.clear();
  pending_.erase(0, reader_.closed() ? end + kCallClose.size() : end);
  state_ = State::content;
  return true;
}

// The calls the reader lists that are not out yet, and what their arguments grew by.
void OutputParser::send_listed_calls(OutputDelta& out) {
  const std::vector<FunctionCall>& calls = reader_.calls();
  for (size_t i = 0; i < calls.size(); ++i) {
    const size_t index = block_first_call_ + i;
    if (index == result_.tool_calls.size()) {  // the header (id and name) is a delta of its own, as vLLM sends it
      result_.tool_calls.push_back({new_call_id(), calls[i].name, ""});
      out.tool_calls.push_back({static_cast<int>(index), result_.tool_calls.back().id, calls[i].name, ""});
    }
    std::string& sent = result_.tool_calls[index].arguments;
    if (calls[i].arguments.size() <= sent.size()) continue;
    std::string_view more = std::string_view(calls[i].arguments).substr(sent.size());
    sent += more;
    ToolCallDelta* last = out.tool_calls.empty() ? nullptr : &out.tool_calls.back();
    if (last && last->index == static_cast<int>(index) && last->id.empty()) last->arguments += more;
    else out.tool_calls.push_back({static_cast<int>(index), "", "", std::string(more)});
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
