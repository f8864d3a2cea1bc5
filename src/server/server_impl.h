#pragma once
// Server internals shared by server.cc (routing, lifecycle, small routes), chat_prompt.cc (a chat request's
// prompt, constraint and parser), completions.cc
// (chat and text completions, streaming and not), messages.cc (the Anthropic Messages API) and
// responses_api.cc (the Responses API).
#include <atomic>
#include <chrono>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/api_request.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/server.h"

namespace ellm {

class OutputParser;

// How a stream is written: OpenAI's `data:` lines ending in [DONE] and comment keep-alives, or
// named events (`event: <type>`): the Anthropic Messages API's (with pings) and the Responses API's.
struct SseDialect {
  std::string (*event)(const nlohmann::json& chunk);
  std::string (*error)(const ApiError& e);
  const char* keep_alive;
  const char* done;
};
extern const SseDialect kOpenAiSse;

struct Server::Impl {
  Impl(Engine& engine, const ChatTemplate& chat_template, ServerOptions options);

  // Routes.
  void chat_completions(const httplib::Request& req, httplib::Response& res);
  void completions(const httplib::Request& req, httplib::Response& res);
  void models(const httplib::Request& req, httplib::Response& res);
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);
  void messages(const httplib::Request& req, httplib::Response& res);
  void count_tokens(const httplib::Request& req, httplib::Response& res);
  void responses(const httplib::Request& req, httplib::Response& res);
  nlohmann::json codex_model_info() const;

  // Shared steps of a generation request.
  void check_model_name(const std::string& requested) const;
  // Where the text `prefix`, which the prompt starts with, ends in the prompt's ids (0: not at a
  // token boundary, or not a prefix).
  int64_t prefix_end(const std::vector<int32_t>& ids, const std::string& prompt, const std::string& prefix) const;
  // A chat request's prompt, rendered into request.generate (ids, history end, constraint);
  // returns the text. Chat completions, Messages and Responses start here.
  std::string prepare_chat(ChatRequest& request) const;
  // The image parts of the messages, decoded and prepared (400 for one that cannot be), and
  // then each image's pad in the tokenized prompt widened to its tokens (server/chat_images.cc).
  std::vector<PreparedImage> chat_images(const nlohmann::ordered_json& messages) const;
  void place_images(std::vector<PreparedImage> images, GenerateRequest& request) const;
  // The parser of a chat reply: reasoning, and tool calls unless tool_choice is none.
  std::unique_ptr<OutputParser> chat_parser(const ChatRequest& request, const std::string& prompt) const;
  std::shared_ptr<RequestStream> submit(GenerateRequest request);
  // n choices of one prompt: n requests, choice i seeded with seed + i when a seed is given. The
  // engine prefills the prompt once and copies it to the others (a prefill in flight is waited
  // for). All or none are submitted.
  std::vector<std::shared_ptr<RequestStream>> submit_choices(const GenerateRequest& request, int n);
  // Serves one generation: Output is ChatOutput, TextOutput, MessagesOutput or ResponsesOutput (whose on_start()
  // events are written as soon as the stream starts).
  template <class Output>
  void respond(std::vector<std::shared_ptr<RequestStream>> streams, std::vector<std::shared_ptr<Output>> outputs,
               bool streaming, bool include_usage, httplib::Response& res, const SseDialect& dialect = kOpenAiSse);
  bool past_grace() const;  // shutting down and the grace period is over: cancel

  Engine& engine;
  const ChatTemplate& chat_template;
  ServerOptions options;
  int64_t sequence_length;
  HttpServer http;
  HttpCounters counters;
  std::atomic<bool> draining{false};
  std::atomic<int64_t> grace_deadline_ns{0};  // steady_clock, valid while draining
  std::atomic<int> in_flight{0};
};

// One line of SSE: "data: <json>\n\n". Invalid UTF-8 from odd tokens is replaced, never thrown.
std::string sse_data(const nlohmann::json& j);
std::string json_text(const nlohmann::json& j);
void send_json(httplib::Response& res, int status, const nlohmann::json& body);
// The error body in the shape of the API the path belongs to (OpenAI's, or Anthropic's for
// /v1/messages).
void send_error(httplib::Response& res, const ApiError& e, const std::string& path = "");

}  // namespace ellm
