// POST /v1/responses: the OpenAI Responses API as a rendering of chat completions. The request
// becomes a ChatRequest (responses_request.h), goes through the same prompt, constraint, parser,
// submission and respond() as /v1/chat/completions, and its events are rendered as Responses
// events (responses_output.h).
#include "server/api_response.h"
#include "server/responses_output.h"
#include "server/responses_request.h"
#include "server/server_impl.h"
#include "text/chat_template.h"

namespace ellm {

using nlohmann::json;

namespace {

// Responses streams name each event (`event: <type>`) and end without [DONE].
std::string responses_event(const json& event) { return "event: " + event["type"].get<std::string>() + "\n" + sse_data(event); }

std::string responses_error(const ApiError& e) {
  return responses_event({{"type", "error"}, {"code", "server_error"}, {"message", e.what()}, {"param", nullptr}});
}

const SseDialect kResponsesSse{responses_event, responses_error, ": keep-alive\n\n", ""};

// A prompt the context cannot hold: a 400 with OpenAI's code, or, for a stream, the stream's
// own failure (response.failed), which is how Responses clients learn to compact.
void context_exceeded(httplib::Response& res, const ResponsesMeta& meta, bool stream, const std::string& message) {
  if (!stream) {
    json error = error_json(ApiError(400, "invalid_request_error", message, "input"));
    error["error"]["code"] = "context_length_exceeded";
    send_json(res, 400, error);
    return;
  }
  ResponsesOutput output(meta, nullptr);
  std::string text;
  for (const json& e : output.on_start()) text += responses_event(e);
  for (const json& e : output.failed("context_length_exceeded", message)) text += responses_event(e);
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_content(text, "text/event-stream");
}

}  // namespace

// The model as Codex's model catalog describes one (`models`, read from /models, or saved as a
// file for its model_catalog_json setting): the context, the tools it is offered (the shell
// through exec_command, apply_patch as a freeform tool) and reasoning levels.
json Server::Impl::codex_model_info() const {
  json levels = json::array();
  for (const char* effort : {"none", "low", "medium", "high"})
    levels.push_back({{"effort", effort}, {"description", std::string("reasoning effort ") + effort}});
  return {{"slug", options.model_name},
          {"display_name", options.model_name},
          {"description", "served by ellm from " + options.model_path},
          {"default_reasoning_level", "medium"},
          {"supported_reasoning_levels", levels},
          {"shell_type", "unified_exec"},
          {"visibility", "list"},
          {"supported_in_api", true},
          {"priority", 0},
          {"upgrade", nullptr},
          {"base_instructions", "You are a coding agent running on the user's machine. Use the tools to inspect and change "
                                "files and run commands; keep answers short."},
          {"supports_reasoning_summaries", false},
          {"support_verbosity", false},
          {"default_verbosity", nullptr},
          {"apply_patch_tool_type", "freeform"},
          {"truncation_policy", {{"mode", "tokens"}, {"limit", 10000}}},
          {"supports_parallel_tool_calls", true},
          {"context_window", sequence_length},
          {"experimental_supported_tools", json::array()},
          {"input_modalities", json::array({"text"})}};
}

void Server::Impl::responses(const httplib::Request& req, httplib::Response& res) {
  ResponsesRequest request = parse_responses_request(parse_body(req.body), engine.default_sampling(), chat_template.source());
  ChatRequest& chat = request.chat;
  check_model_name(chat.model);
  ResponsesMeta meta{random_id("resp_"), options.model_name, unix_time(), json(request.echo), request.custom_tools,
                     request.tool_namespaces, chat.logprobs, [this](int32_t id) { return engine.token_text(id); }};
  const std::string prompt = prepare_chat(chat);
  const int64_t n_prompt = int64_t(chat.generate.prompt.size());
  if (n_prompt >= sequence_length)
    return context_exceeded(res, meta, chat.stream,
                            "the input is " + std::to_string(n_prompt) + " tokens; this model's context holds " +
                                std::to_string(sequence_length) + " tokens, the output included");

  std::vector<std::shared_ptr<RequestStream>> streams;
  try {
    streams.push_back(submit(chat.generate));
  } catch (const ApiError& e) {
    if (e.param == "messages") return context_exceeded(res, meta, chat.stream, e.what());
    throw;
  }
  std::vector<std::shared_ptr<ResponsesOutput>> outputs{std::make_shared<ResponsesOutput>(std::move(meta), chat_parser(chat, prompt))};
  respond(std::move(streams), std::move(outputs), chat.stream, /*include_usage=*/false, res, kResponsesSse);
}

}  // namespace ellm
