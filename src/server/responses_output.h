#pragma once
// Engine events -> the Responses API's typed events and response object. Like ChatOutput it
// feeds one request's StreamEvents through the OutputParser; the parser's deltas (reasoning,
// content, tool-call fragments) become output items: a reasoning item, a message, and a
// function_call or custom_tool_call per call, each opened (output_item.added), grown by its
// deltas and closed (output_item.done) with the whole item. Streaming and not run the same code.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/output_parser.h"

namespace ellm {

struct ResponsesMeta {
  std::string id, model;
  int64_t created = 0;
  nlohmann::json echo;  // request fields the response object repeats
  std::set<std::string> custom_tools;
  std::map<std::string, std::string> tool_namespaces;
  bool logprobs = false;  // output_text parts carry the logprobs of their tokens
  std::function<std::string(int32_t)> token_text;
};

class ResponsesOutput {
 public:
  ResponsesOutput(ResponsesMeta meta, std::unique_ptr<OutputParser> parser);

  // response.created and response.in_progress: sent before the prompt is prefilled.
  std::vector<nlohmann::json> on_start();
  std::vector<nlohmann::json> on_event(const StreamEvent& event);
  // A request refused once its stream had begun: response.failed.
  std::vector<nlohmann::json> failed(const std::string& code, const std::string& message);
  // The response object (once finished: its final status, output items and usage).
  nlohmann::json response() const;
  bool finished() const { return finished_; }

  // The response object of a request that ended before any output, with `error` set.
  static nlohmann::json failed_response(const ResponsesMeta& meta, const std::string& code, const std::string& message);

 private:
  struct Item {
    std::string kind;  // reasoning, message, call
    std::string id, text;      // text: the reasoning, the message text, or the call's arguments
    std::string call_id, name;
    nlohmann::json logprobs = nlohmann::json::array();  // a message's tokens
    int call_index = -1;
    bool done = false;
  };

  nlohmann::json event(const char* type, nlohmann::json fields);
  void open(std::vector<nlohmann::json>& out, Item item);
  void close(std::vector<nlohmann::json>& out);
  void add_text(std::vector<nlohmann::json>& out, const char* kind, const std::string& text,
                const nlohmann::json& logprobs = nlohmann::json::array());
  void add_call(std::vector<nlohmann::json>& out, const ToolCallDelta& delta);
  nlohmann::json item_json(const Item& item) const;
  std::string status() const;

  ResponsesMeta meta_;
  std::unique_ptr<OutputParser> parser_;
  std::vector<Item> items_;
  int64_t sequence_ = 0;
  bool finished_ = false, answered_ = false;
  int64_t reasoning_tokens_ = 0;
  std::string error_code_, error_message_;
  StreamEvent last_;
};

}  // namespace ellm
