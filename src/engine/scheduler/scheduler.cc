// The scheduler's thread and its step, its public calls, the end of a request, and the metrics.
// Placing requests in slots: placement.cc; building and running a pass: pass.cc.
#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include "base/log.h"
#include "text/tokenizer/tokenizer.h"

namespace ellm {
namespace {

EngineMetrics::Histogram histogram(std::vector<double> bounds) {
  EngineMetrics::Histogram h;
  h.counts.assign(bounds.size() + 1, 0);
  h.bounds = std::move(bounds);
  return h;
}

}  // namespace

ActiveRequest::ActiveRequest(const Tokenizer& tokenizer, QueuedRequest&& queued,
                             int64_t cached_tokens)
    : request(std::move(queued.request)),
      stream(std::move(queued.stream)),
      prompt_len(int64_t(request.prompt.size())),
      max_new(queued.max_new),
      cached(cached_tokens),
      detokenizer(tokenizer, request.skip_special_tokens),
      constraint(std::move(queued.constraint)),
      images(request.images),
      proposer(queued.proposer),
      submitted(queued.submitted) {
  sequence.reserve(prompt_len + max_new);
  sequence = request.prompt;
  stop.reset(request.stop);
  depth.start(queued.speculative_depth);
}

Scheduler::Scheduler(Model& model, const Tokenizer& tokenizer, const EngineOptions& options,
                     std::unique_ptr<Model> draft)
    : model_(model),
      tokenizer_(tokenizer),
      options_(options),
      sequence_length_(model.limits().sequence_length),
      vocab_size_(model.vocab_size()),
      chunk_size_(model.limits().chunk_size > 0 ? model.limits().chunk_size
                                                : model.limits().sequence_length),
      sessions_(model, options_),
      slots_(sessions_.slots()),
      store_(sessions_.store()),
      output_(tokenizer, options_, local_metrics_),
      image_rows_(options_.image_cache_bytes) {
  const int64_t n_slots = model.limits().batch_size;
  for (int64_t i = 0; i < n_slots; ++i) samplers_.emplace_back(vocab_size_, sequence_length_);
  active_.resize(n_slots);
  batch_.reserve(model.max_pass_tokens());
  parts_.reserve(n_slots);
  step_batch_.reserve(n_slots);
  step_parts_.reserve(n_slots);
  const int64_t k = options_.num_speculative_tokens;
  logits_.resize(size_t(n_slots * (1 + k)) * vocab_size_);
  idle_slots_ = int(n_slots);
  if (k > 0) {
    proposals_.assign(size_t(n_slots), std::vector<int32_t>(size_t(k)));
    draft_proposer_ = std::make_unique<DraftProposer>(model, std::move(draft), tokenizer.vocab_size());
    draft_jobs_.reserve(size_t(n_slots));
    depth_.resize(size_t(n_slots));
    granted_.resize(size_t(n_slots));
    rate_.resize(size_t(n_slots));
    spec_batch_.reserve(size_t(model.max_pass_tokens()));
  }

  const std::vector<double> latency = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                       0.5,   0.75,  1.0,  2.5,  5.0,  7.5,  10,   20,  40,  80};
  local_metrics_.time_to_first_token = histogram(latency);
  local_metrics_.inter_token_latency = histogram(latency);
  local_metrics_.e2e_latency = histogram(latency);
  local_metrics_.kv_budget_bytes = model.limits().kv_memory_bytes;
  local_metrics_.kv_bytes_per_token = model.kv_bytes_per_token();
  local_metrics_.kv_dtype = kv_dtype_name(model.limits().kv_dtype);
  metrics_ = local_metrics_;
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop_thread(); }

void Scheduler::stop_thread() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::shutdown(Clock::time_point deadline) {
  stop_thread();  // from here on this thread owns the slots
  if (!store_) return;
  int saved = 0;
  for (Slot& slot : slots_) {
    if (Clock::now() >= deadline) break;
    if (slot.tokens.size() < size_t(SessionStore::kBlock)) continue;
    slot.prompt_len = int64_t(slot.tokens.size());  // keep all of it: the next turn resends it
    sessions_.save(slot, 0);
    ++saved;
  }
  store_->flush(deadline);
  log_info("sessions: saved " + std::to_string(saved) + " from the slots; " +
           std::to_string(store_->metrics().disk.sessions) + " on disk");
}

std::vector<SessionInfo> Scheduler::list_sessions() {
  std::vector<SessionInfo> out = store_ ? store_->list() : std::vector<SessionInfo>{};
  std::lock_guard lock(mutex_);
  out.insert(out.end(), hot_sessions_.begin(), hot_sessions_.end());
  return out;
}

int64_t Scheduler::drop_sessions() {
  int64_t dropped = store_ ? store_->drop_all() : 0;
  std::lock_guard lock(mutex_);
  for (const SessionInfo& hot : hot_sessions_) dropped += hot.idle_seconds >= 0 ? 1 : 0;
  drop_hot_ = true;
  wake_.notify_one();
  return dropped;
}

void Scheduler::enqueue(QueuedRequest request) {
  {
    std::lock_guard lock(mutex_);
    // After shutdown no step would ever take it: refuse rather than leave it hanging.
    if (stopping_) throw QueueFull("the server is shutting down");
    // Requests that will find an idle slot at the next step do not count as waiting.
    if (int64_t(queue_.size()) + placing_ >= options_.max_queue + idle_slots_)
      throw QueueFull("the request queue is full (" + std::to_string(options_.max_queue) +
                      " waiting); retry later");
    queue_.push_back(std::move(request));
    admit_blocked_ = false;
  }
  wake_.notify_one();
}

// The store's figures are read now: its writer and restores go on while the scheduler sleeps.
// The hot tier's gauges are the slots', as the last step left them.
EngineMetrics Scheduler::metrics() const {
  EngineMetrics m;
  {
    std::lock_guard lock(mutex_);
    m = metrics_;
  }
  if (store_) {
    const SessionTierMetrics hot = m.sessions.hot;
    m.sessions = store_->metrics();
    m.sessions.hot.sessions = hot.sessions;
    m.sessions.hot.bytes = hot.bytes;
    m.sessions.hot.snapshots = hot.snapshots;
  }
  return m;
}

// No exception leaves this thread: a request's own failure ends that request (on_logits, admit);
// anything else ends the running requests with an error and the loop goes on.
void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_ || drop_hot_ || restores_done_ || running_ > 0 || (!queue_.empty() && !admit_blocked_);
      });
      if (stopping_) break;
    }
    try {
      step();
    } catch (const std::exception& e) {
      fail_running(std::string("engine step failed: ") + e.what());
    } catch (...) {
      fail_running("engine step failed");
    }
  }
  try {
    abort_all();
  } catch (...) {
    log_warn("engine: aborting the remaining requests failed");
  }
}

// Ends every running request with an error. Their KV may be half written: drop the sessions.
void Scheduler::fail_running(const std::string& error) {
  log_warn("engine: " + error);
  for (int s = 0; s < int(active_.size()); ++s) {
    if (!active_[s]) continue;
    try {
      sessions_.forget(slots_[s]);
    } catch (const std::exception&) {  // the session is forgotten; its pages stay counted
    }
    try {
      finish(s, FinishReason::error, error);
    } catch (const std::exception&) {  // out of memory for the event: the slot is freed anyway
    }
  }
}

void Scheduler::step() {
  bool drop_hot = false;
  {
    std::lock_guard lock(mutex_);
    std::swap(drop_hot, drop_hot_);
  }
  if (drop_hot)
    for (Slot& slot : slots_)
      if (!slot.busy) sessions_.forget(slot);
  drop_cancelled();
  finish_restores();
  admit();
  encode_images();
  build_pass();
  if (!batch_.empty()) run_pass();
  publish_metrics();
}

void Scheduler::drop_cancelled() {
  for (int s = 0; s < int(active_.size()); ++s)
    if (active_[s] && active_[s]->stream->cancelled()) finish(s, FinishReason::abort);
  std::lock_guard lock(mutex_);
  std::erase_if(queue_, [](const QueuedRequest& q) {
    if (!q.stream->cancelled()) return false;
    q.stream->push(end_event(FinishReason::abort));
    return true;
  });
}

// Samples the slot's next token (keeping `proposal` when it passes, speculative decoding) and
// streams what it completes (request_output.h); ends the request when that was its last token.
// Returns the token.
int32_t Scheduler::on_logits(int slot, std::span<float> logits, int32_t proposal) {
  const RequestOutput::Next next = output_.on_logits(*active_[slot], samplers_[slot], logits, proposal);
  if (next.end) finish(slot, *next.end);
  return next.token;
}

// Ends the slot's request; the slot keeps the tokens whose KV it wrote.
void Scheduler::finish(int slot_index, FinishReason reason, const std::string& error) {
  std::unique_ptr<ActiveRequest> request = std::move(active_[slot_index]);
  StreamEvent event = output_.end(*request, reason, error);

  Slot& slot = slots_[slot_index];
  slot.busy = false;
  slot.reserved = 0;
  slot.last_used = ++clock_;
  --running_;
  {
    std::lock_guard lock(mutex_);
    ++idle_slots_;
    admit_blocked_ = false;
  }
  // Metrics first, so a client that saw its request end sees it counted.
  publish_metrics();
  request->stream->push(std::move(event));
}

void Scheduler::abort_all() {
  for (int s = 0; s < int(active_.size()); ++s)
    if (active_[s]) finish(s, FinishReason::abort);
  std::lock_guard lock(mutex_);
  // Restores in flight keep their slots' memory until the restorer stops (with the scheduler).
  for (auto& job : restoring_)
    if (job->queued.stream) job->queued.stream->push(end_event(FinishReason::abort));
  for (QueuedRequest& queued : queue_) queued.stream->push(end_event(FinishReason::abort));
  queue_.clear();
}

void Scheduler::publish_metrics() {
  local_metrics_.requests_running = running_;
  local_metrics_.image_cache_bytes = image_rows_.bytes();
  std::vector<SessionInfo> hot;
  bool hot_changed = false;
  // Measuring residency walks the page tables: a few times a second, and whenever all is idle.
  const auto now = Clock::now();
  if (running_ == 0 || now - last_kv_measure_ > std::chrono::milliseconds(250)) {
    try {
      local_metrics_.kv_resident_bytes = model_.kv_resident_bytes();
    } catch (const std::exception&) {  // a gauge: keep the last value
    }
    last_kv_measure_ = now;
    if (store_) local_metrics_.sessions = store_->metrics();
    local_metrics_.sessions.hot.sessions = local_metrics_.sessions.hot.bytes = 0;
    local_metrics_.sessions.hot.snapshots = 0;
    hot.clear();
    for (const Slot& slot : slots_) {
      if (slot.tokens.empty()) continue;
      const int64_t snapshot_bytes = int64_t(slot.snapshots.size() * sessions_.state_bytes());
      local_metrics_.sessions.hot.sessions++;
      local_metrics_.sessions.hot.bytes += int64_t(slot.tokens.size() * model_.kv_bytes_per_token()) + snapshot_bytes;
      local_metrics_.sessions.hot.snapshots += int64_t(slot.snapshots.size());
      SessionInfo info;
      info.id = "slot-" + std::to_string(slot.index);
      info.tier = SessionTier::hot;
      info.tokens = int64_t(slot.tokens.size());
      info.bytes = int64_t(slot.tokens.size() * model_.kv_bytes_per_token()) + snapshot_bytes;
      info.snapshots = int64_t(slot.snapshots.size());
      info.idle_seconds = slot.busy ? -1 : 0;
      hot.push_back(std::move(info));
    }
    hot_changed = true;
  }
  std::lock_guard lock(mutex_);
  local_metrics_.requests_waiting = int64_t(queue_.size());
  metrics_ = local_metrics_;
  if (hot_changed) hot_sessions_.swap(hot);
}

}  // namespace ellm
