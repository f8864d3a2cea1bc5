// POST /v1/chat/completions and /v1/completions: request -> prompt ids -> engine -> response,
// streamed as SSE or returned whole.
#include <algorithm>
#include <chrono>
#include <iterator>
#include <optional>

#include "base/error.h"
#include "server/api_response.h"
#include "server/server_impl.h"
#include "text/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace ellm {

using nlohmann::json;

void Server::Impl::fit_to_sequence(GenerateRequest& request) const {
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  if (prompt == 0) throw_bad_request("the prompt is empty");
  const std::string limit = "this model's maximum context length is " + std::to_string(sequence_length) + " tokens";
  if (prompt >= sequence_length)
    throw_bad_request(limit + "; the prompt has " + std::to_string(prompt) + " tokens, leaving no room to generate", "messages");
  if (request.max_tokens < 0) {
    request.max_tokens = sequence_length - prompt;
  } else if (prompt + request.max_tokens > sequence_length) {
    throw_bad_request(limit + "; you requested " + std::to_string(prompt + request.max_tokens) + " tokens (" +
                          std::to_string(prompt) + " in the prompt, " + std::to_string(request.max_tokens) +
                          " in the completion); reduce the prompt or max_tokens",
                      "max_tokens");
  }
}

std::shared_ptr<RequestStream> Server::Impl::submit(GenerateRequest request) {
  if (!options.session_cache) request.use_session_cache = false;
  try {
    return engine.submit(std::move(request));
  } catch (const QueueFull& e) {
    throw ApiError(429, "rate_limit_error", std::string("the server is busy: ") + e.what() + "; retry later");
  }
}

namespace {

// Tokens of logprobs rendered per SSE chunk at most. The engine merges what a slow reader has not
// taken yet into one compact event (engine.h); rendering thousands of logprobs as JSON at once
// would cost ten times that, so a backlog is rendered and written a slice at a time.
constexpr size_t kLogprobsPerChunk = 64;
constexpr size_t kBytesPerWrite = 64u << 10;  // a provider call stops draining past this

// Takes the next piece of `backlog` (emptied when it is used up): the whole event, or its first
// kLogprobsPerChunk tokens (with all its text, which cannot be split by token) while the rest,
// with the end of the request if it carries it, stays behind.
StreamEvent take_piece(std::optional<StreamEvent>& backlog) {
  StreamEvent& all = *backlog;
  if (all.logprobs.size() <= kLogprobsPerChunk) {
    StreamEvent piece = std::move(all);
    backlog.reset();
    return piece;
  }
  StreamEvent piece;
  piece.text = std::move(all.text);
  all.text.clear();
  const size_t n = kLogprobsPerChunk;
  piece.logprobs.assign(std::make_move_iterator(all.logprobs.begin()), std::make_move_iterator(all.logprobs.begin() + n));
  all.logprobs.erase(all.logprobs.begin(), all.logprobs.begin() + n);
  const size_t ids = std::min(n, all.ids.size());
  piece.ids.assign(all.ids.begin(), all.ids.begin() + ids);
  all.ids.erase(all.ids.begin(), all.ids.begin() + ids);
  return piece;
}

}  // namespace

// Streaming: the provider is called again and again on this connection's HTTP thread. It waits
// briefly for engine events, writes them, and sends an SSE comment when idle so a vanished
// client is noticed (the write fails) and its request cancelled. A client that stops reading
// blocks only this thread (httplib gives up after the write timeout); the engine goes on, and
// what the client has not taken waits compactly in its RequestStream.
template <class Output>
void Server::Impl::respond(std::shared_ptr<RequestStream> stream, std::shared_ptr<Output> output, bool streaming,
                           httplib::Response& res) {
  using Clock = std::chrono::steady_clock;
  constexpr int kPollMs = 100;
  // Counts this request until the last holder (handler or provider) lets go. Not copyable: a
  // copied-from temporary would decrement on its own, and shutdown() would stop waiting for
  // streams still in flight.
  struct InFlight {
    std::atomic<int>& count;
    explicit InFlight(std::atomic<int>& c) : count(c) { count++; }
    InFlight(const InFlight&) = delete;
    ~InFlight() { count--; }
  };
  auto guard = std::make_shared<InFlight>(in_flight);

  if (!streaming) {
    while (!output->finished()) {
      if (past_grace()) stream->cancel();
      std::optional<StreamEvent> event = stream->next(kPollMs);
      if (!event) continue;
      if (event->finished && event->finish_reason == "error")
        throw ApiError(500, "internal_server_error", "generation failed: " + event->error);
      output->on_event(*event);
    }
    send_json(res, 200, output->response());
    return;
  }

  auto last_write = std::make_shared<Clock::time_point>(Clock::now());
  auto backlog = std::make_shared<std::optional<StreamEvent>>();  // taken from the stream, not yet sent
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, stream, output, last_write, backlog, guard](size_t, httplib::DataSink& sink) {
        if (past_grace()) stream->cancel();
        std::string out;
        // Drain what is ready (one write for a burst of tokens), a bounded amount per call.
        while (out.size() < kBytesPerWrite) {
          if (!*backlog) *backlog = stream->next(out.empty() ? kPollMs : 0);
          if (!*backlog) break;
          StreamEvent event = take_piece(*backlog);
          if (event.finished && event.finish_reason == "error") {
            out += sse_data(error_json(ApiError(500, "internal_server_error", "generation failed: " + event.error)));
            out += "data: [DONE]\n\n";
            if (!sink.write(out.data(), out.size())) stream->cancel();
            sink.done();
            return true;
          }
          for (const json& chunk : output->on_event(event)) out += sse_data(chunk);
          if (event.finished) break;
        }
        if (output->finished()) out += "data: [DONE]\n\n";
        else if (out.empty() && Clock::now() - *last_write > std::chrono::seconds(1)) out = ": keep-alive\n\n";
        if (!out.empty()) {
          if (!sink.write(out.data(), out.size())) {
            stream->cancel();
            return false;
          }
          *last_write = Clock::now();
        }
        if (output->finished()) sink.done();
        return true;
      },
      [stream](bool success) {
        if (!success) stream->cancel();  // client gone: the engine frees the slot within a step
      });
}

void Server::Impl::chat_completions(const httplib::Request& req, httplib::Response& res) {
  ChatRequest request = parse_chat_request(parse_body(req.body), options.default_sampling);
  check_model_name(request.model);

  // As vLLM: the template always sees the tools; tool_choice "none" only turns off parsing.
  // "required" and a named function are passed on but not enforced (no constrained decoding).
  const bool parse_tools = !request.tools.empty() && request.tool_choice != "none";
  nlohmann::ordered_json tools = request.tools.empty() ? nlohmann::ordered_json(nullptr) : request.tools;
  std::string prompt = chat_template.render(normalize_chat_messages(request.messages), tools,
                                            /*add_generation_prompt=*/true, request.template_kwargs);
  request.generate.prompt = engine.tokenizer().encode(prompt);
  fit_to_sequence(request.generate);

  ResponseMeta meta{random_id("chatcmpl-"), options.model_name, unix_time(), request.include_usage, request.logprobs, request.stream};
  auto parser = std::make_unique<OutputParser>(parse_tools ? options.tool_call_format : ToolCallFormat::none,
                                               options.parse_reasoning, prompt_opens_reasoning(prompt), json(tools));
  auto output = std::make_shared<ChatOutput>(std::move(meta), std::move(parser), [this](int32_t id) { return token_text(id); });
  respond(submit(std::move(request.generate)), output, request.stream, res);
}

void Server::Impl::completions(const httplib::Request& req, httplib::Response& res) {
  TextRequest request = parse_completion_request(parse_body(req.body), options.default_sampling);
  check_model_name(request.model);
  if (request.prompt_is_ids) {
    for (int32_t id : request.prompt_ids)
      if (id >= engine.tokenizer().vocab_size()) throw_bad_request("'prompt' holds a token id outside the vocabulary", "prompt");
    request.generate.prompt = request.prompt_ids;
  } else {
    request.generate.prompt = engine.tokenizer().encode(request.prompt_text);
  }
  fit_to_sequence(request.generate);
  std::string echo;
  if (request.echo)
    echo = request.prompt_is_ids ? engine.tokenizer().decode(request.prompt_ids, false) : request.prompt_text;

  ResponseMeta meta{random_id("cmpl-"), options.model_name, unix_time(), request.include_usage, request.logprobs, request.stream};
  auto output = std::make_shared<TextOutput>(std::move(meta), std::move(echo), [this](int32_t id) { return token_text(id); });
  respond(submit(std::move(request.generate)), output, request.stream, res);
}

}  // namespace ellm
