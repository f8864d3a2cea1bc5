#pragma once
// Engine events -> Anthropic Messages API objects. A MessagesOutput splits one request's
// StreamEvents with the same OutputParser as chat completions and renders them as content
// blocks: streamed as message_start, per block content_block_start / deltas /
// content_block_stop, message_delta and message_stop, or (not streamed) the whole message,
// which is what those events add up to.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/api_request.h"
#include "server/api_response.h"
#include "server/output_parser.h"

namespace ellm {

// {"type": "error", "error": {"type": ..., "message": ...}}, with Anthropic's type for the status.
nlohmann::json anthropic_error_json(const ApiError& e);

class MessagesOutput {
 public:
  // meta: id, model and prompt_tokens are used. show_thinking false: thinking blocks carry only
  // their signature (thinking.display "omitted").
  MessagesOutput(ResponseMeta meta, std::unique_ptr<OutputParser> parser, bool show_thinking);

  // Streaming: message_start, sent before the first token (a prefill may take long).
  std::vector<nlohmann::json> on_start() const;
  // The events one engine event makes; with the last one, the closing events.
  std::vector<nlohmann::json> on_event(const StreamEvent& event);
  // Non-streaming: the message once the last event was seen.
  nlohmann::json response() const;
  bool finished() const { return finished_; }

 private:
  void open(const char* type, nlohmann::json block, std::vector<nlohmann::json>& events);
  void close(std::vector<nlohmann::json>& events);
  void add_text(const char* type, const std::string& text, std::vector<nlohmann::json>& events);
  std::string stop_reason() const;
  nlohmann::json usage() const;

  ResponseMeta meta_;
  std::unique_ptr<OutputParser> parser_;
  bool show_thinking_;
  nlohmann::json content_ = nlohmann::json::array();  // the blocks so far
  std::string open_type_;                             // type of the last block while open, else ""
  std::string open_text_;                             // its thinking, or its tool input's JSON text
  int open_call_ = -1;                                // the open tool_use block's call index
  bool made_tool_calls_ = false, finished_ = false;
  StreamEvent last_;
};

}  // namespace ellm
