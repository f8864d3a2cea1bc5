#include "server/responses_output.h"

#include "server/api_response.h"
#include "server/responses_request.h"

namespace ellm {

using nlohmann::json;

namespace {

json usage(const StreamEvent& last, int64_t reasoning_tokens) {
  return {{"input_tokens", last.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", last.cached_tokens}}},
          {"output_tokens", last.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", std::min(reasoning_tokens, last.completion_tokens)}}},
          {"total_tokens", last.prompt_tokens + last.completion_tokens}};
}

json base_response(const ResponsesMeta& meta, const std::string& status) {
  json r = {{"id", meta.id},       {"object", "response"}, {"created_at", meta.created}, {"status", status},
            {"error", nullptr},    {"incomplete_details", nullptr}, {"model", meta.model},
            {"output", json::array()}, {"usage", nullptr}};
  for (const auto& [key, value] : meta.echo.items()) r[key] = value;
  return r;
}

// A custom tool's raw text: the one argument it was declared with (the arguments as sent when
// they are not that object, so nothing the model wrote is lost).
std::string custom_input(const std::string& arguments) {
  json parsed = json::parse(arguments, nullptr, false);
  if (parsed.is_object() && parsed.size() == 1 && parsed.contains(kCustomToolArgument) && parsed[kCustomToolArgument].is_string())
    return parsed[kCustomToolArgument].get<std::string>();
  return arguments;
}

}  // namespace

ResponsesOutput::ResponsesOutput(ResponsesMeta meta, std::unique_ptr<OutputParser> parser)
    : meta_(std::move(meta)), parser_(std::move(parser)) {}

json ResponsesOutput::event(const char* type, json fields) {
  fields["type"] = type;
  fields["sequence_number"] = sequence_++;
  return fields;
}

std::vector<json> ResponsesOutput::on_start() {
  json r = base_response(meta_, "in_progress");
  return {event("response.created", {{"response", r}}), event("response.in_progress", {{"response", r}})};
}

json ResponsesOutput::item_json(const Item& item) const {
  const char* status = item.done ? "completed" : "in_progress";
  if (item.kind == "reasoning") {
    json content = json::array();
    if (item.done) content.push_back({{"type", "reasoning_text"}, {"text", item.text}});
    return {{"id", item.id}, {"type", "reasoning"}, {"summary", json::array()}, {"content", content},
            {"encrypted_content", nullptr}, {"status", status}};
  }
  if (item.kind == "message") {
    json content = json::array();
    if (item.done) content.push_back({{"type", "output_text"}, {"text", item.text}, {"annotations", json::array()}, {"logprobs", item.logprobs}});
    return {{"id", item.id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", content}};
  }
  json call = {{"id", item.id}, {"status", status}, {"call_id", item.call_id}, {"name", item.name}};
  if (meta_.custom_tools.contains(item.name)) {
    call["type"] = "custom_tool_call";
    call["input"] = item.done ? custom_input(item.text) : "";
  } else {
    call["type"] = "function_call";
    call["arguments"] = item.done ? item.text : "";
  }
  if (auto ns = meta_.tool_namespaces.find(item.name); ns != meta_.tool_namespaces.end()) call["namespace"] = ns->second;
  return call;
}

void ResponsesOutput::open(std::vector<json>& out, Item item) {
  close(out);
  items_.push_back(std::move(item));
  const Item& it = items_.back();
  const int64_t index = int64_t(items_.size()) - 1;
  out.push_back(event("response.output_item.added", {{"output_index", index}, {"item", item_json(it)}}));
  if (it.kind == "reasoning")
    out.push_back(event("response.content_part.added", {{"item_id", it.id}, {"output_index", index}, {"content_index", 0},
                                                        {"part", {{"type", "reasoning_text"}, {"text", ""}}}}));
  else if (it.kind == "message")
    out.push_back(event("response.content_part.added", {{"item_id", it.id}, {"output_index", index}, {"content_index", 0},
                                                        {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}}));
}

void ResponsesOutput::close(std::vector<json>& out) {
  if (items_.empty() || items_.back().done) return;
  Item& it = items_.back();
  it.done = true;
  const int64_t index = int64_t(items_.size()) - 1;
  const json where = {{"item_id", it.id}, {"output_index", index}};
  auto with = [&](json fields) {
    fields.update(where);
    return fields;
  };
  json item = item_json(it);
  if (it.kind == "reasoning") {
    out.push_back(event("response.reasoning_text.done", with({{"content_index", 0}, {"text", it.text}})));
    out.push_back(event("response.content_part.done", with({{"content_index", 0}, {"part", item["content"][0]}})));
  } else if (it.kind == "message") {
    out.push_back(event("response.output_text.done", with({{"content_index", 0}, {"text", it.text}, {"logprobs", it.logprobs}})));
    out.push_back(event("response.content_part.done", with({{"content_index", 0}, {"part", item["content"][0]}})));
  } else if (item["type"] == "custom_tool_call") {
    // The raw text is known once the call's JSON is whole: it goes out in one delta.
    out.push_back(event("response.custom_tool_call_input.delta", with({{"delta", item["input"]}})));
    out.push_back(event("response.custom_tool_call_input.done", with({{"input", item["input"]}})));
  } else {
    out.push_back(event("response.function_call_arguments.done", with({{"name", it.name}, {"arguments", it.text}})));
  }
  out.push_back(event("response.output_item.done", {{"output_index", index}, {"item", std::move(item)}}));
}

void ResponsesOutput::add_text(std::vector<json>& out, const char* kind, const std::string& text, const json& logprobs) {
  if (text.empty()) return;
  const bool reasoning = std::string_view(kind) == "reasoning";
  if (items_.empty() || items_.back().done || items_.back().kind != kind) {
    Item item;
    item.kind = kind;
    item.id = random_id(reasoning ? "rs_" : "msg_");
    open(out, std::move(item));
  }
  Item& it = items_.back();
  it.text += text;
  for (const json& lp : logprobs) it.logprobs.push_back(lp);
  out.push_back(event(reasoning ? "response.reasoning_text.delta" : "response.output_text.delta",
                      {{"item_id", it.id}, {"output_index", int64_t(items_.size()) - 1}, {"content_index", 0},
                       {"delta", text}, {"logprobs", logprobs}}));
  if (reasoning) out.back().erase("logprobs");
}

void ResponsesOutput::add_call(std::vector<json>& out, const ToolCallDelta& delta) {
  const bool same = !items_.empty() && !items_.back().done && items_.back().call_index == delta.index;
  if (!same) {
    Item call;
    call.kind = "call";
    call.id = random_id(meta_.custom_tools.contains(delta.name) ? "ctc_" : "fc_");
    call.call_id = delta.id.empty() ? random_id("call_") : delta.id;
    call.name = delta.name;
    call.call_index = delta.index;
    open(out, std::move(call));
  }
  Item& it = items_.back();
  it.text += delta.arguments;
  if (!delta.arguments.empty() && !meta_.custom_tools.contains(it.name))
    out.push_back(event("response.function_call_arguments.delta",
                        {{"item_id", it.id}, {"output_index", int64_t(items_.size()) - 1}, {"delta", delta.arguments}}));
}

std::vector<json> ResponsesOutput::on_event(const StreamEvent& e) {
  std::vector<json> out;
  if (finished_) return out;
  OutputDelta delta = parser_->push(e.text, e.finished);
  // Reasoning tokens: what was generated before the answer (content or a call) began.
  if (!answered_ && !delta.content.empty()) answered_ = true;
  if (!answered_ && !delta.tool_calls.empty()) answered_ = true;
  if (!answered_) reasoning_tokens_ += int64_t(e.ids.size());
  add_text(out, "reasoning", delta.reasoning);
  // The event's tokens go with the message text it completes (OpenAI reports logprobs of
  // output_text only); an event that ends the reasoning and starts the text counts as text.
  add_text(out, "message", delta.content,
           meta_.logprobs && !e.logprobs.empty() ? chat_logprob_entries(e.logprobs, meta_.token_text) : json::array());
  for (const ToolCallDelta& t : delta.tool_calls) add_call(out, t);
  if (!e.finished) return out;

  close(out);
  finished_ = true;
  last_ = e;
  if (items_.empty() || items_.front().kind != "reasoning") reasoning_tokens_ = 0;
  if (e.finish_reason == FinishReason::abort) {
    error_code_ = "server_error";
    error_message_ = "the request was cancelled (the server is shutting down, or the client left)";
  } else if (e.finish_reason == FinishReason::error) {
    error_code_ = "server_error";
    error_message_ = "generation failed: " + e.error;
  }
  const std::string s = status();
  const char* type = s == "completed" ? "response.completed" : s == "incomplete" ? "response.incomplete" : "response.failed";
  out.push_back(event(type, {{"response", response()}}));
  return out;
}

std::vector<json> ResponsesOutput::failed(const std::string& code, const std::string& message) {
  finished_ = true;
  error_code_ = code;
  error_message_ = message;
  return {event("response.failed", {{"response", response()}})};
}

std::string ResponsesOutput::status() const {
  if (!finished_) return "in_progress";
  if (!error_code_.empty()) return "failed";
  return last_.finish_reason == FinishReason::length ? "incomplete" : "completed";
}

json ResponsesOutput::response() const {
  json r = base_response(meta_, status());
  for (const Item& it : items_) r["output"].push_back(item_json(it));
  if (!error_code_.empty()) r["error"] = {{"code", error_code_}, {"message", error_message_}};
  if (status() == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (finished_ && error_code_.empty()) r["usage"] = usage(last_, reasoning_tokens_);
  return r;
}

json ResponsesOutput::failed_response(const ResponsesMeta& meta, const std::string& code, const std::string& message) {
  json r = base_response(meta, "failed");
  r["error"] = {{"code", code}, {"message", message}};
  return r;
}

}  // namespace ellm
