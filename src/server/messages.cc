// POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API, as a rendering of
// the chat request and event stream that chat completions serves (anthropic_request.h,
// anthropic_response.h): the same template, constraint, scheduler path, output parser and
// streaming loop.
#include "server/anthropic_request.h"
#include "server/anthropic_response.h"
#include "server/server_impl.h"
#include "text/chat_template.h"

namespace ellm {

namespace {

std::string anthropic_event(const nlohmann::json& event) {
  return "event: " + event["type"].get<std::string>() + "\n" + sse_data(event);
}

std::string anthropic_error(const ApiError& e) { return anthropic_event(anthropic_error_json(e)); }

const SseDialect kAnthropicSse{anthropic_event, anthropic_error, "event: ping\ndata: {\"type\": \"ping\"}\n\n", ""};

}  // namespace

// Any model name is answered by the served model: Claude Code names several (its main model,
// a small fast one for side requests, subagents'), and one server serves one model.
void Server::Impl::messages(const httplib::Request& req, httplib::Response& res) {
  MessagesRequest request = parse_messages_request(parse_body(req.body), engine.default_sampling());
  ChatRequest& chat = request.chat;
  const std::string prompt = prepare_chat(chat);
  // Anthropic's words, which Claude Code reads to compact its conversation and try again.
  const int64_t n_prompt = static_cast<int64_t>(chat.generate.prompt.size());
  if (n_prompt >= sequence_length)
    throw ApiError(400, "invalid_request_error", "prompt is too long: " + std::to_string(n_prompt) + " tokens > " +
                                                     std::to_string(sequence_length - 1) + " maximum", "messages");

  ResponseMeta meta{random_id("msg_"), options.model_name, unix_time(), false, false, chat.stream};
  meta.prompt_tokens = n_prompt;
  auto output = std::make_shared<MessagesOutput>(meta, chat_parser(chat, prompt), request.show_thinking);
  respond<MessagesOutput>({submit(chat.generate)}, {output}, chat.stream, false, res, kAnthropicSse);
}

// Renders and tokenizes only (images are decoded and counted, not encoded): no slot, no queue.
void Server::Impl::count_tokens(const httplib::Request& req, httplib::Response& res) {
  MessagesRequest request = parse_messages_request(parse_body(req.body), engine.default_sampling(), /*count_only=*/true);
  const ChatRequest& chat = request.chat;
  nlohmann::ordered_json tools = chat.tools.empty() ? nlohmann::ordered_json(nullptr) : chat.tools;
  std::vector<PreparedImage> images = chat_images(chat.messages);
  const std::string prompt = chat_template.render(chat.messages, tools, /*add_generation_prompt=*/true, chat.template_kwargs);
  GenerateRequest counted;  // each image's tokens in place
  counted.prompt = engine.encode(prompt);
  place_images(std::move(images), counted);
  send_json(res, 200, {{"input_tokens", counted.prompt.size()}});
}

}  // namespace ellm
