// POST /v1/chat/completions and /v1/completions: request -> prompt ids -> engine -> response,
// streamed as SSE or returned whole.
#include <algorithm>
#include <chrono>
#include <iterator>
#include <optional>

#include "base/error.h"
#include "grammar/token_mask.h"
#include "server/anthropic_response.h"
#include "server/api_response.h"
#include "server/responses_output.h"
#include "server/server_impl.h"
#include "text/chat_template.h"

namespace ellm {

using nlohmann::json;

const SseDialect kOpenAiSse{sse_data, [](const ApiError& e) { return sse_data(error_json(e)) + "data: [DONE]\n\n"; },
                            ": keep-alive\n\n", "data: [DONE]\n\n"};

std::shared_ptr<RequestStream> Server::Impl::submit(GenerateRequest request) {
  try {
    return engine.submit(std::move(request));
  } catch (const QueueFull& e) {
    throw ApiError(429, "rate_limit_error", std::string("the server is busy: ") + e.what());
  } catch (const RequestError& e) {
    throw ApiError(400, "invalid_request_error", e.what(), e.param);
  }
}

std::vector<std::shared_ptr<RequestStream>> Server::Impl::submit_choices(const GenerateRequest& request, int n) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  try {
    for (int i = 0; i < n; ++i) {
      GenerateRequest choice = request;
      if (choice.sampling.seed) choice.sampling.seed = *choice.sampling.seed + uint64_t(i);
      streams.push_back(submit(std::move(choice)));
    }
  } catch (...) {
    for (auto& stream : streams) stream->cancel();
    throw;
  }
  return streams;
}

namespace {

std::shared_ptr<const OutputConstraint> text_constraint(const TextRequest& r) {
  if (!r.json_grammar) return nullptr;
  auto constraint = std::make_shared<OutputConstraint>();
  constraint->grammar = r.json_grammar;
  return constraint;
}

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

// The response of n choices: choice i's chunks and response carry index i; the usage counts the
// prompt once and the completions of all choices (the OpenAI counts).
namespace {

void index_choices(nlohmann::json& chunk, size_t index) {
  for (auto& choice : chunk["choices"]) choice["index"] = index;
}

bool is_usage_chunk(const nlohmann::json& chunk) {
  return chunk.contains("usage") && chunk["choices"].empty();
}

// Sums completion tokens into `total` (the first usage seen keeps its prompt and cached counts).
void add_usage(nlohmann::json& total, const nlohmann::json& usage) {
  if (total.is_null()) {
    total = usage;
    return;
  }
  total["completion_tokens"] = total["completion_tokens"].get<int64_t>() + usage["completion_tokens"].get<int64_t>();
  total["total_tokens"] = total["prompt_tokens"].get<int64_t>() + total["completion_tokens"].get<int64_t>();
}

}  // namespace

// Streaming: the provider is called again and again on this connection's HTTP thread. It waits
// briefly for engine events, writes them, and sends an SSE comment when idle so a vanished
// client is noticed (the write fails) and its requests cancelled. A client that stops reading
// blocks only this thread (the write timeout ends it); the engine goes on, and what the client
// has not taken waits compactly in each RequestStream.
template <class Output>
void Server::Impl::respond(std::vector<std::shared_ptr<RequestStream>> streams,
                           std::vector<std::shared_ptr<Output>> outputs, bool streaming, bool include_usage,
                           httplib::Response& res, const SseDialect& dialect) {
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
  const size_t n = streams.size();
  auto cancel_all = [streams] {
    for (const auto& stream : streams) stream->cancel();
  };
  auto all_finished = [outputs] {
    return std::all_of(outputs.begin(), outputs.end(), [](const auto& o) { return o->finished(); });
  };
  // Waits up to kPollMs for one choice's event: one stream alone waits on it; several are
  // polled in turn, a share of the time each.
  auto wait_ms = n == 1 ? kPollMs : std::max(1, kPollMs / int(n));

  if (!streaming) {
    // Nothing is written until the end, so a client that hangs up is noticed by looking at its
    // socket (as the stream's keep-alives do for streams): then the requests are cancelled and
    // their slots freed within an engine step.
    auto next_check = Clock::now();
    while (!all_finished()) {
      if (past_grace()) cancel_all();
      if (Clock::now() >= next_check) {
        if (HttpServer::client_gone()) cancel_all();
        next_check = Clock::now() + std::chrono::milliseconds(kPollMs);
      }
      for (size_t i = 0; i < n; ++i) {
        if (outputs[i]->finished()) continue;
        std::optional<StreamEvent> event = streams[i]->next(wait_ms);
        if (!event) continue;
        if (event->finished && event->finish_reason == FinishReason::error) {
          cancel_all();
          throw ApiError(500, "internal_server_error", "generation failed: " + event->error);
        }
        outputs[i]->on_event(*event);
      }
    }
    json out = outputs[0]->response();
    if (n > 1) {
      json usage;
      out["choices"] = json::array();
      for (size_t i = 0; i < n; ++i) {
        json one = outputs[i]->response();
        index_choices(one, i);
        out["choices"].push_back(one["choices"][0]);
        add_usage(usage, one["usage"]);
      }
      out["usage"] = usage;
    }
    send_json(res, 200, out);
    return;
  }

  struct Progress {
    std::vector<std::optional<StreamEvent>> backlog;  // taken from a stream, not yet sent
    json usage;                                       // n > 1: the choices' usage, summed
    Clock::time_point last_write = Clock::now();
    bool started = false;
  };
  auto progress = std::make_shared<Progress>();
  progress->backlog.resize(n);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, streams, outputs, progress, guard, n, include_usage, wait_ms, cancel_all, all_finished, dialect](
          size_t, httplib::DataSink& sink) {
        if (past_grace()) cancel_all();
        std::string out;
        if (!progress->started) {  // written at once, before a long prefill ends
          progress->started = true;
          if constexpr (requires { outputs[0]->on_start(); })
            for (const json& event : outputs[0]->on_start()) out += dialect.event(event);
        }
        // Drain what is ready (one write for a burst of tokens), a bounded amount per call.
        for (bool any = true; any && out.size() < kBytesPerWrite;) {
          any = false;
          for (size_t i = 0; i < n && out.size() < kBytesPerWrite; ++i) {
            auto& backlog = progress->backlog[i];
            if (outputs[i]->finished()) continue;
            if (!backlog) backlog = streams[i]->next(out.empty() ? wait_ms : 0);
            if (!backlog) continue;
            any = true;
            StreamEvent event = take_piece(backlog);
            if (event.finished && event.finish_reason == FinishReason::error) {
              out += dialect.error(ApiError(500, "internal_server_error", "generation failed: " + event.error));
              cancel_all();
              sink.write(out.data(), out.size());
              sink.done();
              return true;
            }
            for (json& chunk : outputs[i]->on_event(event)) {
              if (n > 1 && is_usage_chunk(chunk)) {  // one usage chunk for all choices, at the end
                add_usage(progress->usage, chunk["usage"]);
                continue;
              }
              if (n > 1) index_choices(chunk, i);
              out += dialect.event(chunk);
            }
          }
        }
        const bool done = all_finished();
        if (done && n > 1 && include_usage && !progress->usage.is_null()) {
          json chunk = outputs[0]->response();
          chunk["object"] = chunk["object"].get<std::string>() == "chat.completion" ? "chat.completion.chunk"
                                                                                     : chunk["object"];
          chunk.erase("usage");
          chunk["choices"] = json::array();
          chunk["usage"] = progress->usage;
          out += dialect.event(chunk);
        }
        if (done) out += dialect.done;
        else if (out.empty() && Clock::now() - progress->last_write > std::chrono::seconds(1)) out = dialect.keep_alive;
        if (!out.empty()) {
          if (!sink.write(out.data(), out.size())) {
            cancel_all();
            return false;
          }
          progress->last_write = Clock::now();
        }
        if (done) sink.done();
        return true;
      },
      [cancel_all](bool success) {
        if (!success) cancel_all();  // client gone: the engine frees the slots within a step
      });
}

void Server::Impl::chat_completions(const httplib::Request& req, httplib::Response& res) {
  ChatRequest request = parse_chat_request(parse_body(req.body), engine.default_sampling());
  check_model_name(request.model);
  const std::string prompt = prepare_chat(request);

  ResponseMeta meta{random_id("chatcmpl-"), options.model_name, unix_time(), request.include_usage, request.logprobs, request.stream};
  meta.continuous_usage = request.stream && request.continuous_usage;
  meta.prompt_tokens = static_cast<int64_t>(request.generate.prompt.size());
  std::vector<std::shared_ptr<ChatOutput>> outputs;
  for (int i = 0; i < request.n; ++i)
    outputs.push_back(std::make_shared<ChatOutput>(meta, chat_parser(request, prompt), [this](int32_t id) { return engine.token_text(id); }));
  respond(submit_choices(request.generate, request.n), std::move(outputs), request.stream, request.include_usage, res);
}

void Server::Impl::completions(const httplib::Request& req, httplib::Response& res) {
  TextRequest request = parse_completion_request(parse_body(req.body), engine.default_sampling());
  check_model_name(request.model);
  request.generate.prompt = request.prompt_is_ids ? request.prompt_ids : engine.encode(request.prompt_text);
  request.generate.constraint = text_constraint(request);
  std::string echo;
  if (request.echo)
    echo = request.prompt_is_ids ? engine.decode(request.prompt_ids, false) : request.prompt_text;

  ResponseMeta meta{random_id("cmpl-"), options.model_name, unix_time(), request.include_usage, request.logprobs, request.stream};
  meta.continuous_usage = request.stream && request.continuous_usage;
  meta.prompt_tokens = static_cast<int64_t>(request.generate.prompt.size());
  std::vector<std::shared_ptr<TextOutput>> outputs;
  for (int i = 0; i < request.n; ++i)
    outputs.push_back(std::make_shared<TextOutput>(meta, echo, [this](int32_t id) { return engine.token_text(id); }));
  respond(submit_choices(request.generate, request.n), std::move(outputs), request.stream, request.include_usage, res);
}

// The Messages API's streams (messages.cc) are served by the same loop.
template void Server::Impl::respond<MessagesOutput>(std::vector<std::shared_ptr<RequestStream>>,
                                                    std::vector<std::shared_ptr<MessagesOutput>>, bool, bool,
                                                    httplib::Response&, const SseDialect&);
// The Responses API's streams (responses_api.cc) are served by the same loop.
template void Server::Impl::respond<ResponsesOutput>(std::vector<std::shared_ptr<RequestStream>>,
                                                     std::vector<std::shared_ptr<ResponsesOutput>>, bool, bool,
                                                     httplib::Response&, const SseDialect&);

}  // namespace ellm
