#include "engine/engine.h"

#include <cmath>
#include <iterator>

#include "base/error.h"
#include "engine/scheduler.h"

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
  std::shared_ptr<const Tokenizer> tokenizer;
  EngineOptions options;
  Scheduler scheduler;

  Impl(std::unique_ptr<Model> m, std::shared_ptr<const Tokenizer> t, EngineOptions o)
      : model(std::move(m)), tokenizer(std::move(t)), options(std::move(o)),
        scheduler(*model, *tokenizer, options) {}
};

Engine::Engine(std::unique_ptr<Model> model, std::shared_ptr<const Tokenizer> tokenizer,
               EngineOptions options) {
  if (!model || !tokenizer) throw Error("engine: a model and a tokenizer are required");
  for (int32_t id : options.scripted_output)
    if (id < 0 || id >= model->vocab_size())
      throw Error("scripted output: token id " + std::to_string(id) + " is outside the vocabulary");
  impl_ = std::make_unique<Impl>(std::move(model), std::move(tokenizer), std::move(options));
}

Engine::~Engine() = default;

namespace {

// Throws Error for a request that can never run, naming the field.
int64_t validate(const GenerateRequest& request, const Model& model) {
  const int64_t limit = model.limits().sequence_length;
  const int64_t n_prompt = int64_t(request.prompt.size());
  if (n_prompt == 0) throw Error("prompt: must contain at least one token");
  for (int32_t id : request.prompt)
    if (id < 0 || id >= model.vocab_size())
      throw Error("prompt: token id " + std::to_string(id) + " is outside the vocabulary (size " +
                  std::to_string(model.vocab_size()) + ")");
  if (request.max_tokens == 0 || request.max_tokens < -1)
    throw Error("max_tokens: must be at least 1");
  if (n_prompt >= limit)
    throw Error("prompt: " + std::to_string(n_prompt) + " tokens leave no room to generate within "
                "the sequence length limit of " + std::to_string(limit) + " tokens");
  const int64_t max_new = request.max_tokens < 0 ? limit - n_prompt : request.max_tokens;
  if (n_prompt + max_new > limit)
    throw Error("max_tokens: prompt (" + std::to_string(n_prompt) + " tokens) + max_tokens (" +
                std::to_string(max_new) + ") exceeds the sequence length limit of " +
                std::to_string(limit) + " tokens");
  const size_t budget = model.limits().kv_memory_bytes, per_token = model.kv_bytes_per_token();
  if (budget > 0 && per_token > 0 && size_t(n_prompt + max_new) * per_token > budget)
    throw Error("max_tokens: prompt + max_tokens = " + std::to_string(n_prompt + max_new) +
                " positions exceed the KV memory budget of " +
                std::to_string(budget / per_token) + " positions");
  const SamplingParams& s = request.sampling;
  if (!(s.temperature >= 0) || !std::isfinite(s.temperature))
    throw Error("temperature: must be a finite number >= 0");
  if (!(s.top_p > 0 && s.top_p <= 1)) throw Error("top_p: must be in (0, 1]");
  if (!(s.min_p >= 0 && s.min_p <= 1)) throw Error("min_p: must be in [0, 1]");
  if (s.top_k < -1) throw Error("top_k: must be -1, 0 or positive");
  if (!(s.repetition_penalty > 0) || !std::isfinite(s.repetition_penalty))
    throw Error("repetition_penalty: must be a finite number > 0");
  if (!std::isfinite(s.presence_penalty) || !std::isfinite(s.frequency_penalty))
    throw Error("presence_penalty/frequency_penalty: must be finite numbers");
  if (s.top_logprobs < -1 || s.top_logprobs > 20) throw Error("top_logprobs: must be in 0..20");
  return max_new;
}

}  // namespace

std::shared_ptr<RequestStream> Engine::submit(GenerateRequest request) {
  QueuedRequest queued;
  queued.max_new = validate(request, *impl_->model);
  queued.request = std::move(request);
  queued.stream = std::make_shared<RequestStream>();
  queued.submitted = Clock::now();
  auto stream = queued.stream;
  impl_->scheduler.enqueue(std::move(queued));
  return stream;
}

EngineMetrics Engine::metrics() const { return impl_->scheduler.metrics(); }
std::vector<SessionInfo> Engine::list_sessions() { return impl_->scheduler.list_sessions(); }
int64_t Engine::drop_sessions() { return impl_->scheduler.drop_sessions(); }
void Engine::shutdown(std::chrono::steady_clock::time_point deadline) { impl_->scheduler.shutdown(deadline); }
const Model& Engine::model() const { return *impl_->model; }
const Tokenizer& Engine::tokenizer() const { return *impl_->tokenizer; }

}  // namespace ellm
