#include "server/anthropic_response.h"

#include "server/anthropic_request.h"

namespace ellm {

using nlohmann::json;

namespace {

const char* anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

json block_event(const char* type, size_t index) { return {{"type", type}, {"index", index}}; }

}  // namespace

json anthropic_error_json(const ApiError& e) {
  return {{"type", "error"}, {"error", {{"type", anthropic_error_type(e.status)}, {"message", e.what()}}}};
}

MessagesOutput::MessagesOutput(ResponseMeta meta, std::unique_ptr<OutputParser> parser, bool show_thinking)
    : meta_(std::move(meta)), parser_(std::move(parser)), show_thinking_(show_thinking) {}

std::vector<json> MessagesOutput::on_start() const {
  // The cache's share of the prompt is known only at the end: message_delta carries it.
  json message = {{"id", meta_.id},         {"type", "message"},       {"role", "assistant"},
                  {"model", meta_.model},   {"content", json::array()}, {"stop_reason", nullptr},
                  {"stop_sequence", nullptr},
                  {"usage", {{"input_tokens", meta_.prompt_tokens}, {"cache_creation_input_tokens", 0},
                             {"cache_read_input_tokens", 0}, {"output_tokens", 0}}}};
  return {{{"type", "message_start"}, {"message", std::move(message)}}};
}

void MessagesOutput::open(const char* type, json block, std::vector<json>& events) {
  close(events);
  json start = block_event("content_block_start", content_.size());
  start["content_block"] = block;
  events.push_back(std::move(start));
  content_.push_back(std::move(block));
  open_type_ = type;
  open_text_.clear();
}

void MessagesOutput::close(std::vector<json>& events) {
  if (open_type_.empty()) return;
  const size_t index = content_.size() - 1;
  json& block = content_.back();
  if (open_type_ == "thinking") {
    std::string signature = thinking_signature(open_text_);
    json delta = block_event("content_block_delta", index);
    delta["delta"] = {{"type", "signature_delta"}, {"signature", signature}};
    events.push_back(std::move(delta));
    block["signature"] = std::move(signature);
  } else if (open_type_ == "tool_use") {
    // A call cut off mid-arguments keeps what was sent; its input is then empty.
    json input = json::parse(open_text_.empty() ? "{}" : open_text_, nullptr, false);
    block["input"] = input.is_object() ? std::move(input) : json::object();
  }
  events.push_back(block_event("content_block_stop", index));
  open_type_.clear();
}

void MessagesOutput::add_text(const char* type, const std::string& text, std::vector<json>& events) {
  if (text.empty()) return;
  const bool thinking = std::string_view(type) == "thinking";
  if (open_type_ != type)
    open(type, thinking ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}} : json{{"type", "text"}, {"text", ""}},
         events);
  if (thinking) {
    open_text_ += text;
    if (!show_thinking_) return;
  }
  content_.back()[type] = content_.back()[type].get<std::string>() + text;
  json delta = block_event("content_block_delta", content_.size() - 1);
  delta["delta"] = {{"type", thinking ? "thinking_delta" : "text_delta"}, {type, text}};
  events.push_back(std::move(delta));
}

std::vector<json> MessagesOutput::on_event(const StreamEvent& event) {
  std::vector<json> events;
  if (finished_) return events;
  OutputDelta delta = parser_->push(event.text, event.finished);
  // Within one event reasoning comes before content, and content before the calls.
  add_text("thinking", delta.reasoning, events);
  add_text("text", delta.content, events);
  for (const ToolCallDelta& t : delta.tool_calls) {
    made_tool_calls_ = true;
    if (!t.name.empty() || open_type_ != "tool_use" || open_call_ != t.index) {
      open("tool_use", {{"type", "tool_use"}, {"id", t.id}, {"name", t.name}, {"input", json::object()}}, events);
      open_call_ = t.index;
    }
    if (t.arguments.empty()) continue;
    open_text_ += t.arguments;
    json d = block_event("content_block_delta", content_.size() - 1);
    d["delta"] = {{"type", "input_json_delta"}, {"partial_json", t.arguments}};
    events.push_back(std::move(d));
  }
  if (!event.finished) return events;

  finished_ = true;
  last_ = event;
  close(events);
  if (event.finish_reason == FinishReason::abort) {
    events.push_back(anthropic_error_json(ApiError(503, "", "the request was cancelled: the server is shutting down")));
    return events;
  }
  json stop_sequence = stop_reason() == "stop_sequence" ? json(event.stop_sequence) : json(nullptr);
  events.push_back({{"type", "message_delta"},
                    {"delta", {{"stop_reason", stop_reason()}, {"stop_sequence", stop_sequence}}},
                    {"usage", usage()}});
  events.push_back({{"type", "message_stop"}});
  return events;
}

std::string MessagesOutput::stop_reason() const {
  if (last_.finish_reason == FinishReason::length) return "max_tokens";
  if (made_tool_calls_) return "tool_use";
  return last_.stop_sequence.empty() ? "end_turn" : "stop_sequence";
}

json MessagesOutput::usage() const {
  return {{"input_tokens", last_.prompt_tokens - last_.cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", last_.cached_tokens},
          {"output_tokens", last_.completion_tokens}};
}

json MessagesOutput::response() const {
  return {{"id", meta_.id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", meta_.model},
          {"content", content_},
          {"stop_reason", stop_reason()},
          {"stop_sequence", stop_reason() == "stop_sequence" ? json(last_.stop_sequence) : json(nullptr)},
          {"usage", usage()}};
}

}  // namespace ellm
