#include "server/api_response.h"

#include <algorithm>
#include <chrono>
#include <random>

namespace ellm {

using nlohmann::json;

json error_json(const ApiError& e) {
  return {{"error",
           {{"message", e.what()},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.status}}}};
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

std::string random_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char hex[33];
  for (int i = 0; i < 2; i++) std::snprintf(hex + 16 * i, 17, "%016llx", static_cast<unsigned long long>(rng()));
  return prefix + hex;
}

int64_t unix_time() {
  using namespace std::chrono;
  return duration_cast<seconds>(system_clock::now().time_since_epoch()).count();
}

namespace {

json byte_list(const std::string& s) {
  json bytes = json::array();
  for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

json chat_logprob_entries(const std::vector<TokenLogprob>& lps, const TokenText& token_text) {
  json entries = json::array();
  for (const TokenLogprob& lp : lps) {
    std::string token = token_text(lp.id);
    json top = json::array();
    for (const auto& [id, logprob] : lp.top) {
      std::string alt = token_text(id);
      top.push_back({{"token", alt}, {"logprob", logprob}, {"bytes", byte_list(alt)}});
    }
    entries.push_back({{"token", token}, {"logprob", lp.logprob}, {"bytes", byte_list(token)}, {"top_logprobs", top}});
  }
  return entries;
}

namespace {

// stream_options.continuous_usage_stats: each chunk that has no usage yet gets the counts so far.
void add_running_usage(std::vector<json>& chunks, const ResponseMeta& meta, int64_t completion_tokens) {
  if (!meta.continuous_usage) return;
  for (json& c : chunks)
    if (!c.contains("usage"))
      c["usage"] = {{"prompt_tokens", meta.prompt_tokens},
                    {"completion_tokens", completion_tokens},
                    {"total_tokens", meta.prompt_tokens + completion_tokens}};
}

// One entry per call index, as OpenAI and vLLM send a chunk: a call's header (id, name) and
// its first arguments fragment may come from one step, and a client that reads tool_calls[0]
// would lose the fragment of a second entry.
std::vector<ToolCallDelta> one_entry_per_index(std::vector<ToolCallDelta> deltas) {
  std::vector<ToolCallDelta> merged;
  for (ToolCallDelta& t : deltas) {
    auto same = std::find_if(merged.begin(), merged.end(), [&](const ToolCallDelta& m) { return m.index == t.index; });
    if (same == merged.end()) {
      merged.push_back(std::move(t));
      continue;
    }
    if (same->id.empty()) same->id = std::move(t.id);
    if (same->name.empty()) same->name = std::move(t.name);
    same->arguments += t.arguments;
  }
  return merged;
}

}  // namespace

// ---- chat ----

ChatOutput::ChatOutput(ResponseMeta meta, std::unique_ptr<OutputParser> parser, TokenText token_text)
    : meta_(std::move(meta)), parser_(std::move(parser)), token_text_(std::move(token_text)) {}

json ChatOutput::chunk(json delta, const json& logprobs) const {
  return {{"id", meta_.id},
          {"object", "chat.completion.chunk"},
          {"created", meta_.created},
          {"model", meta_.model},
          {"choices", json::array({{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", logprobs}, {"finish_reason", nullptr}}})}};
}

std::string ChatOutput::finish_reason() const {
  if (made_tool_calls_ && last_.finish_reason == FinishReason::stop) return "tool_calls";
  return finish_reason_name(last_.finish_reason);
}

std::vector<json> ChatOutput::on_event(const StreamEvent& event) {
  std::vector<json> chunks;
  if (finished_) return chunks;
  if (!sent_role_) {
    chunks.push_back(chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
    sent_role_ = true;
  }
  OutputDelta delta = parser_->push(event.text, event.finished);
  completion_tokens_ = event.finished ? event.completion_tokens : completion_tokens_ + int64_t(event.ids.size());

  json logprobs = nullptr;
  if (meta_.logprobs && !event.logprobs.empty()) {
    json entries = chat_logprob_entries(event.logprobs, token_text_);
    if (!meta_.streaming)
      for (const json& e : entries) logprobs_.push_back(e);
    logprobs = {{"content", std::move(entries)}};
  }
  if (!delta.empty() || !logprobs.is_null()) {
    json d = json::object();
    if (!delta.content.empty()) d["content"] = delta.content;
    if (!delta.reasoning.empty()) {
      d["reasoning_content"] = delta.reasoning;
      d["reasoning"] = delta.reasoning;
    }
    if (!delta.tool_calls.empty()) {
      made_tool_calls_ = true;
      json calls = json::array();
      for (const ToolCallDelta& t : one_entry_per_index(std::move(delta.tool_calls))) {
        json call = {{"index", t.index}};
        json function = json::object();
        if (!t.id.empty()) {  // the header of a call: id, type and name come once
          call["id"] = t.id;
          call["type"] = "function";
        }
        if (!t.name.empty()) function["name"] = t.name;
        function["arguments"] = t.arguments;
        call["function"] = std::move(function);
        calls.push_back(std::move(call));
      }
      d["tool_calls"] = std::move(calls);
    }
    chunks.push_back(chunk(std::move(d), logprobs));
  }
  if (event.finished) {
    finished_ = true;
    last_ = event;
    if (!parser_->result().tool_calls.empty()) made_tool_calls_ = true;
    json last = chunk(json::object(), nullptr);
    last["choices"][0]["finish_reason"] = finish_reason();
    chunks.push_back(std::move(last));
    if (meta_.include_usage) {
      json usage = chunk(json::object(), nullptr);
      usage["choices"] = json::array();
      usage["usage"] = usage_json(event.prompt_tokens, event.completion_tokens, event.cached_tokens);
      chunks.push_back(std::move(usage));
    }
  }
  add_running_usage(chunks, meta_, completion_tokens_);
  return chunks;
}

json ChatOutput::response() const {
  const ParsedOutput& out = parser_->result();
  json message = {{"role", "assistant"}};
  message["content"] = out.content.empty() && !out.tool_calls.empty() ? json(nullptr) : json(out.content);
  if (!out.reasoning.empty()) {
    message["reasoning_content"] = out.reasoning;
    message["reasoning"] = out.reasoning;
  } else {
    message["reasoning_content"] = nullptr;
  }
  if (!out.tool_calls.empty()) {
    json calls = json::array();
    for (const ToolCall& t : out.tool_calls)
      calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
    message["tool_calls"] = std::move(calls);
  }
  json choice = {{"index", 0},
                 {"message", std::move(message)},
                 {"logprobs", meta_.logprobs ? json{{"content", logprobs_}} : json(nullptr)},
                 {"finish_reason", finish_reason()}};
  return {{"id", meta_.id},
          {"object", "chat.completion"},
          {"created", meta_.created},
          {"model", meta_.model},
          {"choices", json::array({std::move(choice)})},
          {"usage", usage_json(last_.prompt_tokens, last_.completion_tokens, last_.cached_tokens)}};
}

// ---- completions ----

TextOutput::TextOutput(ResponseMeta meta, std::string echo_prefix, TokenText token_text)
    : meta_(std::move(meta)), pending_echo_(std::move(echo_prefix)), token_text_(std::move(token_text)) {}

json TextOutput::chunk(const std::string& text, json logprobs, json finish) const {
  return {{"id", meta_.id},
          {"object", "text_completion"},
          {"created", meta_.created},
          {"model", meta_.model},
          {"choices", json::array({{{"index", 0}, {"text", text}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish)}}})}};
}

// Completions form: parallel lists of tokens, their logprobs, {alternative: logprob} maps and
// character offsets into the text.
json TextOutput::logprobs_for(const std::vector<TokenLogprob>& lps, size_t text_offset) const {
  json out = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()}, {"text_offset", json::array()}};
  for (const TokenLogprob& lp : lps) {
    std::string token = token_text_(lp.id);
    json top = json::object();
    for (const auto& [id, logprob] : lp.top) top[token_text_(id)] = logprob;
    out["tokens"].push_back(token);
    out["token_logprobs"].push_back(lp.logprob);
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(text_offset);
    text_offset += token.size();
  }
  return out;
}

std::vector<json> TextOutput::on_event(const StreamEvent& event) {
  std::vector<json> chunks;
  if (finished_) return chunks;
  std::string text = std::move(pending_echo_) + event.text;
  pending_echo_.clear();
  completion_tokens_ = event.finished ? event.completion_tokens : completion_tokens_ + int64_t(event.ids.size());
  json logprobs = nullptr;
  if (meta_.logprobs && !event.logprobs.empty()) {
    logprobs = logprobs_for(event.logprobs, text_.size());
    if (!meta_.streaming)
      for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
        for (const json& x : logprobs[key]) logprobs_[key].push_back(x);
  }
  text_ += text;
  if (!text.empty() || !logprobs.is_null()) chunks.push_back(chunk(text, std::move(logprobs), nullptr));
  if (event.finished) {
    finished_ = true;
    last_ = event;
    chunks.push_back(chunk("", nullptr, finish_reason_name(event.finish_reason)));
    if (meta_.include_usage) {
      json usage = chunk("", nullptr, nullptr);
      usage["choices"] = json::array();
      usage["usage"] = usage_json(event.prompt_tokens, event.completion_tokens, event.cached_tokens);
      chunks.push_back(std::move(usage));
    }
  }
  add_running_usage(chunks, meta_, completion_tokens_);
  return chunks;
}

json TextOutput::response() const {
  json out = chunk(text_, meta_.logprobs ? logprobs_ : json(nullptr), finish_reason_name(last_.finish_reason));
  out["usage"] = usage_json(last_.prompt_tokens, last_.completion_tokens, last_.cached_tokens);
  return out;
}

}  // namespace ellm
