#include "engine/engine.h"

#include <cmath>
#include <iterator>
#include <mutex>
#include <tuple>

#include "base/error.h"
#include "engine/prompt_images.h"
#include "engine/scheduler/scheduler.h"
#include "grammar/token_mask.h"
#include "text/tokenizer/tokenizer.h"

namespace ellm {

std::optional<StreamEvent> RequestStream::next(int timeout_ms) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); }))
    return std::nullopt;
  StreamEvent event = std::move(events_.front());
  events_.pop_front();
  return event;
}

void RequestStream::push(StreamEvent event) {
  {
    std::lock_guard lock(mutex_);
    StreamEvent* waiting = events_.empty() ? nullptr : &events_.back();
    if (waiting && !waiting->finished && !event.finished) {
      waiting->text += event.text;
      waiting->ids.insert(waiting->ids.end(), event.ids.begin(), event.ids.end());
      waiting->logprobs.insert(waiting->logprobs.end(), std::make_move_iterator(event.logprobs.begin()),
                               std::make_move_iterator(event.logprobs.end()));
    } else {
      events_.push_back(std::move(event));
    }
  }
  ready_.notify_one();
}

size_t RequestStream::queued() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

struct Engine::Impl {
  std::unique_ptr<Model> model;
  bool has_draft = false;
  std::shared_ptr<const Tokenizer> tokenizer;
  EngineOptions options;
  // For constrained decoding: built by the first request that needs it (about 0.2 s), not by
  // every engine (tests make hundreds; sanitizers make it seconds).
  std::once_flag vocab_once;
  std::shared_ptr<const VocabIndex> vocab;
  Scheduler scheduler;

  const std::shared_ptr<const VocabIndex>& vocab_index() {
    std::call_once(vocab_once, [&] { vocab = std::make_shared<const VocabIndex>(*tokenizer); });
    return vocab;
  }

  Impl(std::unique_ptr<Model> m, std::shared_ptr<const Tokenizer> t, EngineOptions o,
       std::unique_ptr<Model> draft)
      : model(std::move(m)), has_draft(draft != nullptr), tokenizer(std::move(t)),
        options(std::move(o)), scheduler(*model, *tokenizer, options, std::move(draft)) {}
};

Engine::Engine(std::unique_ptr<Model> model, std::shared_ptr<const Tokenizer> tokenizer,
               EngineOptions options, std::unique_ptr<Model> draft) {
  if (!model || !tokenizer) throw Error("engine: a model and a tokenizer are required");
  if (options.num_speculative_tokens < 0 ||
      options.num_speculative_tokens > model->limits().speculative_tokens)
    throw Error("engine: --num-speculative-tokens " + std::to_string(options.num_speculative_tokens) +
                " needs the model loaded for as many (it was for " +
                std::to_string(model->limits().speculative_tokens) + ")");
  if (options.speculative == Proposer::mtp && !model->has_mtp())
    throw Error("engine: speculative mtp needs the model's MTP head loaded");
  if (options.speculative == Proposer::draft && !draft)
    throw Error("engine: speculative draft needs a draft model");
  for (const auto& script : options.scripted_outputs)
    for (int32_t id : script)
      if (id < 0 || id >= model->vocab_size())
        throw Error("scripted output: token id " + std::to_string(id) + " is outside the vocabulary");
  impl_ = std::make_unique<Impl>(std::move(model), std::move(tokenizer), std::move(options), std::move(draft));
}

Engine::~Engine() = default;

namespace {

// Throws RequestError for a request that can never run, naming the field (as vLLM words it).
// Returns the most tokens it may generate: max_tokens, shortened to what the context and the
// KV budget leave unless strict.
int64_t validate(const GenerateRequest& request, const Model& model, bool strict) {
  const int64_t limit = model.limits().sequence_length;
  const int64_t n_prompt = int64_t(request.prompt.size());
  const std::string context = "this model's maximum context length is " + std::to_string(limit) + " tokens";
  if (n_prompt == 0) throw RequestError("messages", "the prompt is empty");
  for (int32_t id : request.prompt)
    if (id < 0 || id >= model.vocab_size())
      throw RequestError("prompt", "the prompt holds token id " + std::to_string(id) +
                                       ", outside the vocabulary (size " + std::to_string(model.vocab_size()) + ")");
  if (request.max_tokens == 0 || request.max_tokens < -1)
    throw RequestError("max_tokens", "max_tokens must be at least 1");
  if (n_prompt >= limit)
    throw RequestError("messages", context + "; the prompt has " + std::to_string(n_prompt) +
                                       " tokens, leaving no room to generate");
  const size_t budget = kv_budget_after_state(model), per_token = model.kv_bytes_per_token();
  const int64_t budget_positions = budget > 0 && per_token > 0 ? int64_t(budget / per_token) : limit;
  if (n_prompt >= budget_positions)
    throw RequestError("messages", "the prompt has " + std::to_string(n_prompt) +
                                       " tokens; the KV memory budget holds " + std::to_string(budget_positions) +
                                       " positions, leaving no room to generate");
  const int64_t room = std::min(limit, budget_positions) - n_prompt;
  if (request.max_tokens < 0) return room;
  if (request.max_tokens <= room || !strict) return std::min(request.max_tokens, room);
  if (n_prompt + request.max_tokens > limit)
    throw RequestError("max_tokens", context + "; you requested " + std::to_string(n_prompt + request.max_tokens) +
                                         " tokens (" + std::to_string(n_prompt) + " in the prompt, " +
                                         std::to_string(request.max_tokens) +
                                         " in the completion); reduce the prompt or max_tokens");
  throw RequestError("max_tokens", "prompt + max_tokens = " + std::to_string(n_prompt + request.max_tokens) +
                                       " positions exceed the KV memory budget of " +
                                       std::to_string(budget_positions) + " positions");
}

// The proposer and depth of a request's speculative decoding.
std::pair<Proposer, int> speculation_of(const GenerateRequest& request, const EngineOptions& options,
                                        const Model& model, bool has_draft) {
  Proposer proposer = options.speculative;
  if (!request.speculative.empty()) {
    if (request.speculative.rfind("draft:", 0) == 0)
      throw RequestError("speculative", "a draft model is the server's (--speculative draft:PATH); ask for \"draft\"");
    try {
      proposer = parse_proposer(request.speculative, "speculative");
    } catch (const Error& e) {
      throw RequestError("speculative", e.what());
    }
  }
  int64_t depth = request.num_speculative_tokens < 0 ? options.num_speculative_tokens
                                                     : request.num_speculative_tokens;
  if (request.num_speculative_tokens > options.num_speculative_tokens)
    throw RequestError("num_speculative_tokens", "at most " + std::to_string(options.num_speculative_tokens) +
                                                     " (the server's --num-speculative-tokens)");
  if (proposer != Proposer::none && options.num_speculative_tokens == 0)
    throw RequestError("speculative", "the server runs without speculative decoding (--num-speculative-tokens 0)");
  if (proposer == Proposer::none || depth == 0) return {Proposer::none, 0};
  if (proposer == Proposer::mtp && !model.has_mtp())
    throw RequestError("speculative", "mtp needs the model's MTP head (serve --speculative mtp)");
  if (proposer == Proposer::draft && !has_draft)
    throw RequestError("speculative", "the server has no draft model (serve --speculative draft:PATH)");
  return {proposer, int(depth)};
}

// The sampling fields, checked once.
void validate_sampling(const GenerateRequest& request) {
  const SamplingParams& s = request.sampling;
  if (!(s.temperature >= 0) || !std::isfinite(s.temperature))
    throw RequestError("temperature", "temperature must be a finite number >= 0");
  if (!(s.top_p > 0 && s.top_p <= 1)) throw RequestError("top_p", "top_p must be in (0, 1]");
  if (!(s.min_p >= 0 && s.min_p <= 1)) throw RequestError("min_p", "min_p must be in [0, 1]");
  if (s.top_k < -1) throw RequestError("top_k", "top_k must be -1, 0 or positive");
  if (!(s.repetition_penalty > 0) || !std::isfinite(s.repetition_penalty))
    throw RequestError("repetition_penalty", "repetition_penalty must be a finite number > 0");
  if (!std::isfinite(s.presence_penalty) || !std::isfinite(s.frequency_penalty))
    throw RequestError("presence_penalty", "presence_penalty and frequency_penalty must be finite numbers");
  if (s.top_logprobs < -1 || s.top_logprobs > 20) throw RequestError("top_logprobs", "top_logprobs must be in 0..20");
}

}  // namespace

std::shared_ptr<RequestStream> Engine::submit(GenerateRequest request) {
  QueuedRequest queued;
  queued.max_new = validate(request, *impl_->model, impl_->options.strict_max_tokens);
  validate_sampling(request);
  std::tie(queued.proposer, queued.speculative_depth) = speculation_of(request, impl_->options, *impl_->model, impl_->has_draft);
  adopt_prompt_images(request, *impl_->model);
  // The draft model and the MTP head see token ids only, not an image's rows; prompt lookup
  // copies text and stops before an image's pads (Scheduler::add_proposals).
  if (!request.images.empty() && queued.proposer != Proposer::ngram) queued.proposer = Proposer::none;
  if (request.constraint) {
    std::vector<int32_t> end_tokens = request.stop_token_ids;
    if (!request.ignore_eos)
      end_tokens.insert(end_tokens.end(), impl_->options.eos_token_ids.begin(), impl_->options.eos_token_ids.end());
    for (int32_t id : end_tokens)
      if (id < 0 || id >= impl_->tokenizer->vocab_size()) throw RequestError("stop_token_ids", "a stop token id is outside the vocabulary");
    queued.constraint = std::make_unique<TokenConstraint>(*request.constraint, impl_->vocab_index(), std::move(end_tokens));
  }
  queued.request = std::move(request);
  queued.stream = std::make_shared<RequestStream>();
  queued.submitted = Clock::now();
  auto stream = queued.stream;
  impl_->scheduler.enqueue(std::move(queued));
  return stream;
}

EngineMetrics Engine::metrics() const {
  EngineMetrics m = impl_->scheduler.metrics();
  m.mapped_table = impl_->model->mapped_table();  // beside a pass: counters and mincore only
  return m;
}
std::vector<SessionInfo> Engine::list_sessions() { return impl_->scheduler.list_sessions(); }
int64_t Engine::drop_sessions() { return impl_->scheduler.drop_sessions(); }
void Engine::shutdown(std::chrono::steady_clock::time_point deadline) { impl_->scheduler.shutdown(deadline); }
int64_t Engine::sequence_length() const { return impl_->model->limits().sequence_length; }
int32_t Engine::image_token_id() const { return impl_->model->image_token_id(); }
bool Engine::resumes_at_snapshots() const {
  return impl_->options.session_cache && impl_->model->has_recurrent_state();
}
const SamplingParams& Engine::default_sampling() const { return impl_->options.default_sampling; }
std::vector<int32_t> Engine::encode(const std::string& text) const { return impl_->tokenizer->encode(text); }
std::string Engine::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return impl_->tokenizer->decode(std::vector<int32_t>(ids.begin(), ids.end()), skip_special_tokens);
}
bool Engine::is_token(int32_t id) const { return id >= 0 && id < impl_->tokenizer->vocab_size(); }
std::string Engine::token_text(int32_t id) const { return is_token(id) ? impl_->tokenizer->token_bytes(id) : std::string(); }

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::abort: return "abort";
    case FinishReason::error: return "error";
  }
  return "error";
}

}  // namespace ellm
