#pragma once
// Engine events -> OpenAI/vLLM response objects. A ChatOutput / TextOutput consumes one request's
// StreamEvents and yields the SSE chunks to send (streaming) or, at the end, the whole response
// (non-streaming); both paths run the same code, so they split text the same way.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/api_request.h"
#include "server/output_parser.h"

namespace ellm {

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_json(const ApiError& e);
nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);
std::string random_id(const std::string& prefix);  // "chatcmpl-3f9c..."
int64_t unix_time();

// Text of one token for logprobs (special tokens included).
using TokenText = std::function<std::string(int32_t)>;
// The chat form of logprobs, as the Responses API's output_text logprobs too:
// [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}].
nlohmann::json chat_logprob_entries(const std::vector<TokenLogprob>& lps, const TokenText& token_text);

struct ResponseMeta {
  std::string id, model;
  int64_t created = 0;
  bool include_usage = false;  // streaming: a usage chunk before [DONE]
  bool logprobs = false;
  // Streaming: only the chunks are sent, so the logprobs are not also kept for response(); a
  // stalled reader's request then costs its unsent chunks, not a JSON copy of every logprob.
  bool streaming = false;
  bool continuous_usage = false;  // streaming: every chunk carries the usage so far (vLLM)
  int64_t prompt_tokens = 0;      // for that usage
};

class ChatOutput {
 public:
  ChatOutput(ResponseMeta meta, std::unique_ptr<OutputParser> parser, TokenText token_text);

  // Streaming chunks for one event: the role first, then content/reasoning/tool-call deltas, and
  // with the last event the finish_reason chunk and the optional usage chunk.
  std::vector<nlohmann::json> on_event(const StreamEvent& event);
  // Non-streaming: the chat.completion object once the last event was seen.
  nlohmann::json response() const;
  bool finished() const { return finished_; }
  const StreamEvent& last_event() const { return last_; }

 private:
  nlohmann::json chunk(nlohmann::json delta, const nlohmann::json& logprobs) const;
  std::string finish_reason() const;

  ResponseMeta meta_;
  std::unique_ptr<OutputParser> parser_;
  TokenText token_text_;
  bool sent_role_ = false, finished_ = false, made_tool_calls_ = false;
  int64_t completion_tokens_ = 0;  // so far
  nlohmann::json logprobs_ = nlohmann::json::array();
  StreamEvent last_;
};

class TextOutput {
 public:
  TextOutput(ResponseMeta meta, std::string echo_prefix, TokenText token_text);
  std::vector<nlohmann::json> on_event(const StreamEvent& event);
  nlohmann::json response() const;
  bool finished() const { return finished_; }
  const StreamEvent& last_event() const { return last_; }

 private:
  nlohmann::json chunk(const std::string& text, nlohmann::json logprobs, nlohmann::json finish) const;
  nlohmann::json logprobs_for(const std::vector<TokenLogprob>& lps, size_t text_offset) const;

  ResponseMeta meta_;
  std::string text_;
  std::string pending_echo_;
  TokenText token_text_;
  bool finished_ = false;
  int64_t completion_tokens_ = 0;  // so far
  nlohmann::json logprobs_ = {{"tokens", nlohmann::json::array()},
                              {"token_logprobs", nlohmann::json::array()},
                              {"top_logprobs", nlohmann::json::array()},
                              {"text_offset", nlohmann::json::array()}};
  StreamEvent last_;
};

}  // namespace ellm
