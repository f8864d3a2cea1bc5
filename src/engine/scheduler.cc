#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "base/hash.h"
#include "base/log.h"
#include "model/config.h"

namespace ellm {
namespace {

EngineMetrics::Histogram histogram(std::vector<double> bounds) {
  EngineMetrics::Histogram h;
  h.counts.assign(bounds.size() + 1, 0);
  h.bounds = std::move(bounds);
  return h;
}

void observe(EngineMetrics::Histogram& h, double seconds) {
  for (size_t i = 0; i < h.bounds.size(); ++i)
    if (seconds <= h.bounds[i]) ++h.counts[i];
  ++h.counts.back();
  h.sum += seconds;
  ++h.count;
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

bool contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

StreamEvent end_event(FinishReason reason, const std::string& error = {}) {
  StreamEvent event;
  event.finished = true;
  event.finish_reason = reason;
  event.error = error;
  return event;
}

// The text a generated id completes. A model's vocabulary may be padded beyond the
// tokenizer's (Qwen3: 151,936 rows, 151,669 tokens); an id without a token decodes to nothing.
std::string decode_next(IncrementalDetokenizer& detokenizer, const Tokenizer& tokenizer, int32_t id) {
  if (id < 0 || id >= tokenizer.vocab_size()) return {};
  try {
    return detokenizer.push(id);
  } catch (const Error&) {  // a hole in the tokenizer's ids
    return {};
  }
}

std::string what(const std::exception& e) { return e.what(); }


// Adds a capture, keeping them sorted with one per position.
void add_capture(std::vector<PlannedCapture>& captures, PlannedCapture capture) {
  auto at = std::find_if(captures.begin(), captures.end(),
                         [&](const PlannedCapture& c) { return c.position >= capture.position; });
  if (at != captures.end() && at->position == capture.position)
    at->shared = at->shared || capture.shared;
  else
    captures.insert(at, capture);
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
      proposer(queued.proposer),
      submitted(queued.submitted) {
  sequence.reserve(prompt_len + max_new);
  sequence = request.prompt;
  stop.reset(request.stop);
  speculation.start(queued.speculative_depth);
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
      budget_positions_(kv_budget_after_state(model) > 0 && model.kv_bytes_per_token() > 0
                            ? int64_t(kv_budget_after_state(model) / model.kv_bytes_per_token())
                            : INT64_MAX),
      hybrid_(model.has_recurrent_state()),
      state_bytes_(model.state_bytes_per_slot()),
      snapshot_positions_(model.kv_bytes_per_token() > 0
                              ? int64_t((state_bytes_ + model.kv_bytes_per_token() - 1) / model.kv_bytes_per_token())
                              : 0) {
  const int64_t n_slots = model.limits().batch_size;
  for (int64_t i = 0; i < n_slots; ++i) {
    Slot slot;
    slot.index = int(i);
    slot.tokens.reserve(sequence_length_);
    slots_.push_back(std::move(slot));
    samplers_.emplace_back(vocab_size_, sequence_length_);
  }
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
    drafter_ = std::make_unique<Drafter>(model, std::move(draft), tokenizer.vocab_size());
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
  if (options_.session_cache) {
    SessionStoreOptions store;
    std::vector<std::span<uint8_t>> probe;
    model.kv_ranges(0, 0, 1, false, probe);
    store.identity.n_ranges = probe.size();
    store.identity.row_bytes = probe.empty() ? 0 : probe[0].size();
    store.identity.fingerprint = model.fingerprint();
    const std::string format = model.kv_format();
    store.identity.format_hash = hash_bytes(format.data(), format.size());
    store.identity.state_bytes = state_bytes_;
    store.snapshot_interval = options_.state_snapshot_interval;
    store.memory_bytes = options_.session_memory_bytes;
    store.dir = options_.session_dir;
    store.disk_bytes = options_.session_disk_bytes;
    store_ = std::make_unique<SessionStore>(std::move(store));
  }
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
    save(slot, 0);
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
      fail_running("engine step failed: " + what(e));
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
      forget(slots_[s]);
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
      if (!slot.busy) forget(slot);
  drop_cancelled();
  finish_restores();
  admit();
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

// Moves waiting requests into idle slots, first come first served, but for requests deferred
// until a prefill in flight writes the prefix they share with it. A request that cannot start
// (a failure while making room for it) ends with an error; the queue goes on. The queue's lock
// is not held while a request is placed: a restore from disk takes a while.
void Scheduler::admit() {
  std::vector<QueuedRequest> passed;  // deferred, or the one that must wait: back to the front
  for (;;) {
    QueuedRequest queued;
    {
      std::lock_guard lock(mutex_);
      if (queue_.empty()) break;
      queued = std::move(queue_.front());
      queue_.pop_front();
      ++placing_;  // still counts as waiting for the queue's limit
    }
    Placement placement = Placement::placed;
    placed_in_slot_ = false;
    try {
      placement = place(queued);
    } catch (const std::exception& e) {
      queued.stream->push(end_event(FinishReason::error, "could not start the request: " + what(e)));
    }
    if (placement == Placement::placed) {
      std::lock_guard lock(mutex_);
      if (!placed_in_slot_) --placing_;
      continue;
    }
    passed.push_back(std::move(queued));
    if (placement == Placement::wait) break;
  }
  std::lock_guard lock(mutex_);
  admit_blocked_ = !passed.empty();
  placing_ -= int64_t(passed.size());
  for (auto it = passed.rbegin(); it != passed.rend(); ++it) queue_.push_front(std::move(*it));
}

// Copies a slot's session to the store when a client would send enough of it again (its prompt
// tokens beyond the `keep` positions that stay), before the slot's KV is overwritten. A hybrid
// model's session goes with its snapshots and one of its live state, where its next turn resumes.
void Scheduler::save(const Slot& slot, int64_t keep) {
  if (!store_ || !worth_saving(slot, keep)) return;
  const int64_t n = int64_t(slot.tokens.size());
  kv_from_.clear();
  model_.kv_ranges(slot.index, 0, n, false, kv_from_);
  kv_out_.assign(kv_from_.begin(), kv_from_.end());
  std::vector<StateSnapshot> snapshots;
  if (hybrid_) {
    for (const StateSnapshot& s : slot.snapshots)
      if (s.position <= n) snapshots.push_back(s);
    if (model_.state_end(slot.index) == n) {
      StateSnapshot end{n, new_state_buffer(state_bytes_), false};
      state_from_.clear();
      model_.state_ranges(slot.index, false, state_from_);
      uint8_t* to = end.state.get();
      for (std::span<uint8_t> range : state_from_) to = std::copy(range.begin(), range.end(), to);
      add_snapshot(snapshots, std::move(end));
      store_->count_hot_snapshots(1, 0, 0);
    }
  }
  store_->put(slot.tokens, kv_out_, std::move(snapshots));
}

// Drops a slot's session (its KV may be half written, or it is saved already) and gives its
// KV pages back.
void Scheduler::forget(Slot& slot) {
  slot.tokens.clear();  // first: if releasing fails, no request may reuse this KV
  slot.prompt_len = 0;
  drop_snapshots(slot, 0);
  if (slot.kv_high > 0) model_.release_kv(slot.index, 0);
  slot.kv_high = 0;
}

// Drops the slot's snapshots beyond position `above` (saved already, or of no more use).
void Scheduler::drop_snapshots(Slot& slot, int64_t above) {
  const size_t before = slot.snapshots.size();
  std::erase_if(slot.snapshots, [&](const StateSnapshot& s) { return s.position > above; });
  if (store_ && before > slot.snapshots.size()) store_->count_hot_snapshots(0, 0, int64_t(before - slot.snapshots.size()));
}

void Scheduler::evict(Slot& slot) {
  save(slot, 0);
  forget(slot);
}

// Evicts idle sessions other than `chosen` and `keep` (a restore's source), least recently used
// first, to the store, until `need` more positions fit under the KV budget.
bool Scheduler::make_room(int chosen, int keep, int64_t need) {
  while (committed_positions(slots_, chosen, snapshot_positions_) + need > budget_positions_) {
    Slot* victim = nullptr;
    for (Slot& slot : slots_)
      if (!slot.busy && slot.index != chosen && slot.index != keep &&
          (slot.kv_high > 0 || !slot.snapshots.empty()) && (!victim || slot.last_used < victim->last_used))
        victim = &slot;
    if (!victim) return false;
    evict(*victim);
  }
  return true;
}

// Copies the first `reuse` positions of KV from another slot, and for a hybrid model the state
// there, into the slot.
void Scheduler::copy_from_slot(Slot& slot, int source, int64_t reuse) {
  const auto start = Clock::now();
  kv_from_.clear();
  kv_to_.clear();
  model_.kv_ranges(source, 0, reuse, false, kv_from_);
  model_.kv_ranges(slot.index, 0, reuse, true, kv_to_);
  for (size_t r = 0; r < kv_to_.size(); ++r) std::memcpy(kv_to_[r].data(), kv_from_[r].data(), kv_to_[r].size());
  slot.kv_high = std::max(slot.kv_high, reuse);
  if (hybrid_) restore_state(slot, snapshot_at_or_before(slots_[source].snapshots, reuse), source, reuse);
  const double seconds = seconds_between(start, Clock::now());
  const double bytes = double(reuse) * double(model_.kv_bytes_per_token()) + double(hybrid_ ? state_bytes_ : 0);
  store_->count_hot_hit(reuse, int64_t(bytes), seconds);
  char line[160];
  std::snprintf(line, sizeof line, "sessions: restored %lld tokens from slot %d into slot %d in %.1f ms (%.2f GB/s)",
                static_cast<long long>(reuse), source, slot.index, seconds * 1e3, bytes / std::max(seconds, 1e-9) / 1e9);
  log_info(line);
}

// Puts the state at `position` into a hybrid model's slot: a snapshot's copy, or the live state
// of slot `source` when no snapshot is there (it ends there).
void Scheduler::restore_state(Slot& slot, const StateSnapshot* snapshot, int source, int64_t position) {
  state_to_.clear();
  model_.state_ranges(slot.index, true, state_to_);
  if (snapshot && snapshot->position == position) {
    const uint8_t* from = snapshot->state.get();
    for (std::span<uint8_t> range : state_to_) {
      std::memcpy(range.data(), from, range.size());
      from += range.size();
    }
  } else {
    if (source < 0 || model_.state_end(source) != position)
      fail("sessions", "no state of position " + std::to_string(position) + " to resume slot " +
                           std::to_string(slot.index) + " from");
    state_from_.clear();
    model_.state_ranges(source, false, state_from_);
    for (size_t r = 0; r < state_to_.size(); ++r) std::memcpy(state_to_[r].data(), state_from_[r].data(), state_to_[r].size());
  }
  model_.set_state_end(slot.index, position);
  store_->count_hot_snapshots(0, 1, 0);
}

// The snapshots a hybrid model's prefill takes: where the conversation so far ends (the next
// turn resumes there), at the end of the prefix another session shares (where the next
// conversation with the same start resumes), and every interval positions (where any other may).
std::vector<PlannedCapture> Scheduler::plan_captures(int64_t reuse, int64_t common, int64_t history_end,
                                                     int64_t reusable) const {
  std::vector<PlannedCapture> captures;
  if (!hybrid_ || !store_) return captures;
  const int64_t interval = options_.state_snapshot_interval;
  if (interval > 0)
    for (int64_t p = (reuse / interval + 1) * interval; p <= reusable; p += interval) captures.push_back({p, false});
  if (history_end > reuse && history_end <= reusable) add_capture(captures, {history_end, false});
  if (common - reuse >= SessionStore::kBlock && common <= reusable) add_capture(captures, {common, true});
  return captures;
}

// Gives the request a slot (placed), or ends it when the KV budget can never hold it (placed
// too: it is done). wait: no idle slot, or running requests hold the budget it needs. defer: a
// prefill in flight is writing a longer prefix of its prompt than any held now.
//
// Its KV comes from the longest prefix held anywhere that it can resume (for a hybrid model:
// that ends at a snapshot of its state): a slot (idle or busy) or the store. The slot it takes
// is the one that costs least to take; the session that slot held is saved to the store first
// when its client would resend it. So no session is destroyed to reuse another's shorter
// prefix, and N conversations sharing a system prompt compute it once. A prefix from the store
// is copied in on the restorer thread; the request starts when it is in place.
Scheduler::Placement Scheduler::place(QueuedRequest& queued) {
  const auto& prompt = queued.request.prompt;
  const bool use_cache = options_.session_cache && queued.request.use_session_cache;
  const int64_t reusable = int64_t(prompt.size()) - 1;  // the last token is computed for its logits
  for (Slot& slot : slots_) slot.state_end = model_.state_end(slot.index);
  SlotMatch hot = use_cache ? best_slot_match(slots_, prompt, reusable, hybrid_) : SlotMatch{};
  StoredMatch stored = use_cache && store_ ? store_->find(prompt, reusable) : StoredMatch{};
  const bool from_store = stored.tokens > hot.tokens;
  const int source = from_store ? -1 : hot.slot;
  int64_t reuse = from_store ? stored.tokens : hot.tokens;
  const int64_t common = std::max(hot.common, stored.common);  // held somewhere, resumable or not
  // A prefill in flight will write a longer prefix of this prompt (agents arriving together
  // with one system prompt, the n choices of one request): wait for it, and copy it then. A
  // hybrid model can resume it only where that prefill takes a snapshot: it takes one there.
  if (use_cache)
    for (int s = 0; s < int(active_.size()); ++s) {
      ActiveRequest* other = active_[s].get();
      const int64_t written = int64_t(slots_[s].tokens.size());
      if (!other || written >= other->prompt_len) continue;
      std::span<const int32_t> other_prompt(other->sequence.data(), size_t(other->prompt_len));
      const int64_t shared = std::min<int64_t>(common_prefix(other_prompt, prompt), reusable);
      if (shared < reuse + SessionStore::kBlock) continue;
      if (!hybrid_) return Placement::defer;
      if (shared > written && store_) {
        add_capture(other->captures, {shared, true});
        return Placement::defer;
      }
    }
  const int target = choose_slot(slots_, source, reuse);
  if (target < 0) return Placement::wait;
  Slot& slot = slots_[target];
  const bool in_place = target == source;

  // A stored prefix: what its restore will read (it may have gone meanwhile: then the next
  // best), taken before the slot's session is saved, which may push it out of RAM.
  RestorePlan plan;
  for (int attempt = 0; from_store && reuse > 0 && attempt < 3; ++attempt) {
    plan = store_->plan_restore(stored, sequence_length_);
    if (plan.end > 0) break;
    stored = store_->find(prompt, reusable);
    reuse = stored.tokens;
  }
  if (from_store) reuse = plan.end > 0 ? plan.match.tokens : 0;

  // Its session leaves the slot: to the store first if worth it, and its tokens no longer
  // describe the KV from the first position the request rewrites.
  save(slot, in_place ? reuse : 0);
  const bool state_in_place = in_place && slot.state_end == reuse;
  slot.tokens.resize(in_place ? reuse : 0);
  drop_snapshots(slot, in_place ? reuse : 0);
  slot.prompt_len = std::min<int64_t>(slot.prompt_len, int64_t(slot.tokens.size()));

  // Committed KV: evict idle sessions (LRU, to the store) before refusing anyone. The snapshots
  // its prefill will take count too.
  std::vector<PlannedCapture> captures = plan_captures(reuse, common, queued.request.history_end, reusable);
  int64_t reserve = int64_t(prompt.size()) + queued.max_new + int64_t(captures.size()) * snapshot_positions_;
  const int64_t own = int64_t(slot.snapshots.size()) * snapshot_positions_;
  if (!make_room(slot.index, source, std::max(reserve, slot.kv_high) + own)) {
    if (slot.kv_high > reserve) {
      model_.release_kv(slot.index, reserve);
      slot.kv_high = reserve;
    }
    if (!make_room(slot.index, source, reserve + own)) {
      // Running requests (and those being restored) will give their reservations back.
      if (running_ > 0 || !restoring_.empty()) return Placement::wait;
      const double per_token = double(model_.kv_bytes_per_token());
      queued.stream->push(end_event(
          FinishReason::error, "KV memory budget exceeded: the request needs " + format_mib(reserve * per_token) +
                       " of KV cache, the budget is " + format_mib(budget_positions_ * per_token)));
      return Placement::placed;
    }
  }
  if (from_store && reuse > 0) {
    restore_in_background(slot, std::move(queued), std::move(plan), reserve, common, std::move(captures));
    return Placement::placed;
  }
  if (reuse > 0 && !in_place) {
    copy_from_slot(slot, source, reuse);
  } else if (reuse > 0) {  // in place: the rows are there; a hybrid's state too, or in a snapshot
    const auto start = Clock::now();
    if (hybrid_ && !state_in_place) restore_state(slot, snapshot_at_or_before(slot.snapshots, reuse), -1, reuse);
    store_->count_hot_hit(reuse, hybrid_ && !state_in_place ? int64_t(state_bytes_) : 0,
                          seconds_between(start, Clock::now()));
  }
  occupy(slot, reserve);
  start(slot, std::move(queued), reuse, common, std::move(captures));
  return Placement::placed;
}

// Copies a stored prefix into the slot on the restorer thread: the slot's KV pages are
// committed here (the model's thread team does it), the bytes are copied or read there, and the
// request starts once they are in place (finish_restores), while other slots keep decoding.
void Scheduler::restore_in_background(Slot& slot, QueuedRequest&& queued, RestorePlan plan, int64_t reserve,
                                      int64_t common, std::vector<PlannedCapture> captures) {
  auto pending = std::make_unique<PendingRestore>();
  PendingRestore* job = pending.get();
  job->queued = std::move(queued);
  job->slot = slot.index;
  job->reserve = reserve;
  job->common = common;
  job->captures = std::move(captures);
  job->plan = std::move(plan);
  model_.kv_ranges(slot.index, 0, job->plan.end, true, job->kv);
  model_.state_ranges(slot.index, true, job->state);
  slot.kv_high = std::max(slot.kv_high, job->plan.end);
  job->start = Clock::now();
  occupy(slot, reserve);
  restoring_.push_back(std::move(pending));
  restorer_.post([this, job] {
    int64_t restored = 0;
    try {
      restored = store_->restore(job->plan, job->kv, job->state, job->inherited);
    } catch (const std::exception& e) {  // out of memory for a snapshot: computed instead
      log_warn(std::string("sessions: restore failed: ") + e.what());
    }
    std::lock_guard lock(mutex_);
    job->restored = restored;
    job->done = true;
    restores_done_ = true;
    wake_.notify_one();
  });
}

// Starts the requests whose prefix is in place. One whose session went away or failed its
// checks goes back to the front of the queue, to be placed afresh.
void Scheduler::finish_restores() {
  std::vector<std::unique_ptr<PendingRestore>> done;
  {
    std::lock_guard lock(mutex_);
    restores_done_ = false;
    for (auto& pending : restoring_)
      if (pending->done) done.push_back(std::move(pending));
    std::erase(restoring_, nullptr);
  }
  for (auto& job : done) {
    Slot& slot = slots_[job->slot];
    if (job->restored <= 0) {
      slot.busy = false;
      slot.reserved = 0;
      std::lock_guard lock(mutex_);
      ++idle_slots_;
      queue_.push_front(std::move(job->queued));
      admit_blocked_ = false;
      continue;
    }
    const double seconds = seconds_between(job->start, Clock::now());
    const double bytes = double(job->plan.end) * double(model_.kv_bytes_per_token()) +
                         double(hybrid_ ? state_bytes_ : 0);
    char line[160];
    std::snprintf(line, sizeof line, "sessions: restored %lld tokens from %s into slot %d in %.1f ms (%.2f GB/s)",
                  static_cast<long long>(job->restored), tier_name(job->plan.match.tier), slot.index, seconds * 1e3,
                  bytes / std::max(seconds, 1e-9) / 1e9);
    log_info(line);
    if (hybrid_) {
      model_.set_state_end(slot.index, job->restored);
      slot.snapshots = std::move(job->inherited);
      thin_snapshots(slot.snapshots, options_.state_snapshot_interval);
    }
    start(slot, std::move(job->queued), job->restored, job->common, std::move(job->captures));
  }
}

// The slot is taken: by a request, or by the restore of its prefix.
void Scheduler::occupy(Slot& slot, int64_t reserve) {
  slot.busy = true;
  slot.reserved = reserve;
  slot.last_used = ++clock_;
  std::lock_guard lock(mutex_);
  --idle_slots_;
  // In the same step the request stops counting as placed-but-waiting, or a request arriving
  // meanwhile would see it twice (in placing_ and in the slot it took) and get a 429 that
  // --max-queue 0 promises only when every slot is taken.
  --placing_;
  placed_in_slot_ = true;
}

// The request runs in its (occupied) slot, which holds its first `reuse` positions.
void Scheduler::start(Slot& slot, QueuedRequest&& queued, int64_t reuse, int64_t common,
                      std::vector<PlannedCapture> captures) {
  const auto& prompt = queued.request.prompt;
  const int64_t n_prompt = int64_t(prompt.size());
  slot.tokens.assign(prompt.begin(), prompt.begin() + reuse);
  samplers_[slot.index].start(queued.request.sampling, prompt);
  active_[slot.index] = std::make_unique<ActiveRequest>(tokenizer_, std::move(queued), reuse);
  if (const auto& scripts = options_.scripted_outputs; !scripts.empty())
    active_[slot.index]->script = &scripts[std::min(scripts_started_++, scripts.size() - 1)];
  active_[slot.index]->captures = std::move(captures);
  slot.prompt_len = n_prompt;
  ++running_;
  local_metrics_.prompt_tokens_total += n_prompt;
  local_metrics_.cached_tokens_total += reuse;
  local_metrics_.recomputed_tokens_total += std::max<int64_t>(0, common - reuse);
}

// A decode token for every generating slot.
void Scheduler::add_decode_tokens(std::vector<BatchToken>& batch, std::vector<PassPart>& parts) {
  for (int s = 0; s < int(active_.size()); ++s) {
    const ActiveRequest* request = active_[s].get();
    if (!request || int64_t(slots_[s].tokens.size()) < request->prompt_len) continue;
    int32_t position = int32_t(slots_[s].tokens.size());
    batch.push_back({request->sequence[position], s, position, true});
    parts.push_back({s, 1, true});
  }
}

// One pass: a decode token for every generating slot, then prefill up to the chunk size.
void Scheduler::build_pass() {
  batch_.clear();
  parts_.clear();
  captures_.clear();
  add_decode_tokens(batch_, parts_);
  const size_t n_decode = batch_.size();
  int64_t room = std::min(chunk_size_, model_.max_pass_tokens() - int64_t(batch_.size()));
  // Oldest admission first, so a long prompt in chunks is not overtaken forever.
  while (room > 0) {
    int next = -1;
    for (int s = 0; s < int(active_.size()); ++s) {
      bool prefilling = active_[s] && int64_t(slots_[s].tokens.size()) < active_[s]->prompt_len;
      bool planned = std::any_of(parts_.begin(), parts_.end(), [&](auto& p) { return p.slot == s; });
      if (prefilling && !planned && (next < 0 || slots_[s].last_used < slots_[next].last_used))
        next = s;
    }
    if (next < 0) break;
    const ActiveRequest& request = *active_[next];
    int64_t begin = int64_t(slots_[next].tokens.size());
    int64_t count = std::min(request.prompt_len - begin, room);
    bool logits = begin + count == request.prompt_len;
    auto capture = request.captures.begin();
    for (int64_t p = begin; p < begin + count; ++p) {
      batch_.push_back({request.sequence[p], next, int32_t(p), logits && p + 1 == begin + count});
      while (capture != request.captures.end() && capture->position < p + 1) ++capture;
      if (capture != request.captures.end() && capture->position == p + 1) {
        StateSnapshot snapshot{p + 1, new_state_buffer(state_bytes_), capture->shared};
        batch_.back().snapshot = snapshot.state.get();
        captures_.emplace_back(next, std::move(snapshot));
      }
    }
    parts_.push_back({next, count, logits});
    room -= count;
  }
  // A prefill that would stop the generating slots too long runs in parts, and their decode
  // steps run between the parts instead of in this pass.
  const double stall = options_.max_decode_stall_seconds;
  const int64_t n_prefill = int64_t(batch_.size() - n_decode);
  in_parts_ = n_decode > 0 && stall > 0 && double(n_prefill) * prefill_seconds_per_token_ > stall / 2;
  pass_has_prefill_ = n_prefill > 0;
  if (in_parts_) {
    batch_.erase(batch_.begin(), batch_.begin() + ptrdiff_t(n_decode));
    parts_.erase(parts_.begin(), parts_.begin() + ptrdiff_t(n_decode));
  } else if (drafter_) {
    add_proposals(n_decode);
  }
}

// Speculative decoding: proposals for the decoding slots (parts_[0, n_decode)), each slot's next
// token and its proposals one group, all with logits. How many each stream proposes follows how
// many it got kept; together they stay within speculative_pass_rows and the pass's room.
void Scheduler::add_proposals(size_t n_decode) {
  int wanted = 0;
  for (size_t i = 0; i < n_decode; ++i) {
    const ActiveRequest& request = *active_[parts_[i].slot];
    // The group's tokens after the next one write KV that only kept tokens would need.
    const int64_t left = request.max_new - request.generated - 1;
    depth_[i] = request.proposer == Proposer::none ? 0 : int(std::min<int64_t>(request.speculation.depth(), left));
    rate_[i] = request.speculation.rate();
    wanted += depth_[i];
    if (depth_[i] == 0) active_[parts_[i].slot]->speculation.step_without();
  }
  if (wanted == 0) return;
  const int64_t room = std::min(options_.speculative_pass_rows - int64_t(n_decode),
                                model_.max_pass_tokens() - int64_t(batch_.size()));
  share_budget(std::span(depth_).first(n_decode), std::span<const double>(rate_).first(n_decode),
               int(std::max<int64_t>(room, 0)), granted_);

  // The proposals: prompt lookup here, the models' by proposer, all slots of one at once.
  for (Proposer proposer : {Proposer::mtp, Proposer::draft}) {
    draft_jobs_.clear();
    for (size_t i = 0; i < n_decode; ++i) {
      const int s = parts_[i].slot;
      const ActiveRequest& request = *active_[s];
      if (request.proposer == proposer && depth_[i] > 0)
        draft_jobs_.push_back({s, request.sequence, depth_[i], proposals_[s].data()});
    }
    const auto start = Clock::now();
    drafter_->propose(proposer, draft_jobs_);
    if (!draft_jobs_.empty())
      local_metrics_.speculative[int(proposer)].propose_seconds += seconds_between(start, Clock::now());
    for (const DraftJob& job : draft_jobs_)
      for (size_t i = 0; i < n_decode; ++i)
        if (parts_[i].slot == job.slot) parts_[i].proposed = job.made;
  }
  spec_batch_.clear();
  for (size_t i = 0; i < n_decode; ++i) {
    PassPart& part = parts_[i];
    ActiveRequest& request = *active_[part.slot];
    if (request.proposer == Proposer::ngram && depth_[i] > 0) {
      const auto start = Clock::now();
      part.proposed = propose_ngram(request.sequence, depth_[i], proposals_[part.slot].data());
      local_metrics_.speculative[int(Proposer::ngram)].propose_seconds += seconds_between(start, Clock::now());
    }
    const BatchToken next = batch_[i];
    if (part.proposed == 0) {
      spec_batch_.push_back(next);
      continue;
    }
    spec_batch_.push_back({next.token, next.slot, next.position, true, true});
    for (int64_t j = 0; j < part.proposed; ++j)
      spec_batch_.push_back({proposals_[part.slot][j], next.slot, int32_t(next.position + 1 + j), true, true});
    part.count = 1 + part.proposed;
  }
  spec_batch_.insert(spec_batch_.end(), batch_.begin() + ptrdiff_t(n_decode), batch_.end());
  batch_.swap(spec_batch_);
}

void Scheduler::run_pass() {
  const auto start = Clock::now();
  try {
    if (in_parts_) {
      if (!run_in_parts()) return;
    } else {
      model_.forward(batch_, logits_.data());
      const double seconds = seconds_between(start, Clock::now());
      if (!pass_has_prefill_) decode_step_seconds_ = seconds;
      if (batch_.size() >= 64) prefill_seconds_per_token_ = seconds / double(batch_.size());
    }
  } catch (const std::exception& e) {
    // The KV these tokens were writing cannot be trusted: drop those sessions.
    fail_parts(parts_, std::string("model forward failed: ") + e.what());
    return;
  }
  take_results(parts_);
}

// Runs batch_ in parts (a layer over some rows each); between two parts, when the generating
// slots would otherwise wait past the stall limit, one decode step for them. Returns false when
// the pass was dropped: every request in it was cancelled, or the scheduler is stopping.
bool Scheduler::run_in_parts() {
  const double stall = options_.max_decode_stall_seconds;
  const int64_t n = int64_t(batch_.size());
  // Parts of about a quarter of the stall limit: the first sized from the last pass's speed,
  // each next one from the part before (at most twice as many rows: attention grows with them).
  const double part_target = stall / 4;
  const int64_t layers = std::max<int64_t>(1, model_.config().num_hidden_layers);
  int64_t rows = std::clamp<int64_t>(int64_t(part_target * double(layers) / prefill_seconds_per_token_), 16, n);
  double prefill_seconds = 0;
  auto last_token = Clock::now();  // the previous pass gave the generating slots theirs
  model_.begin_pass(batch_);
  for (;;) {
    const auto start = Clock::now();
    const bool done = model_.run_part(rows, logits_.data());
    const double part_seconds = seconds_between(start, Clock::now());
    prefill_seconds += part_seconds;
    if (done) break;
    const int64_t next_rows = std::clamp<int64_t>(
        int64_t(double(rows) * std::min(2.0, part_target / std::max(part_seconds, 1e-6))), 16, n);
    const double next_part_seconds = part_seconds * double(next_rows) / double(rows);
    rows = next_rows;
    bool all_cancelled = std::all_of(parts_.begin(), parts_.end(),
                                     [&](const PassPart& p) { return active_[p.slot]->stream->cancelled(); });
    bool stopping = false;
    {
      std::lock_guard lock(mutex_);
      stopping = stopping_;
    }
    if (all_cancelled || stopping) {  // a shutdown need not wait for the rest of a long prefill
      model_.cancel_pass();
      for (const PassPart& part : parts_) {
        forget(slots_[part.slot]);
        finish(part.slot, FinishReason::abort);
      }
      return false;
    }
    if (seconds_between(last_token, Clock::now()) + next_part_seconds + decode_step_seconds_ >= stall) {
      decode_between_parts();
      last_token = Clock::now();
    }
  }
  prefill_seconds_per_token_ = prefill_seconds / double(n);
  return true;
}

// One decode step for the generating slots while a pass is open (its slots are prefilling, so
// none of them is in it).
void Scheduler::decode_between_parts() {
  for (int s = 0; s < int(active_.size()); ++s)
    if (active_[s] && active_[s]->stream->cancelled() &&
        int64_t(slots_[s].tokens.size()) >= active_[s]->prompt_len)
      finish(s, FinishReason::abort);
  step_batch_.clear();
  step_parts_.clear();
  add_decode_tokens(step_batch_, step_parts_);
  if (step_batch_.empty()) return;
  const auto start = Clock::now();
  try {
    model_.forward(step_batch_, logits_.data());
  } catch (const std::exception& e) {
    fail_parts(step_parts_, std::string("model forward failed: ") + e.what());
    return;
  }
  decode_step_seconds_ = seconds_between(start, Clock::now());
  take_results(step_parts_);
}

void Scheduler::fail_parts(std::span<const PassPart> parts, const std::string& error) {
  for (const PassPart& part : parts) {
    try {
      forget(slots_[part.slot]);
      if (drafter_) drafter_->forget(part.slot);
    } catch (const std::exception&) {  // the session is forgotten; its pages stay counted
    }
    if (active_[part.slot]) finish(part.slot, FinishReason::error, error);
  }
}

// After a pass: the slots hold the tokens fed, and the logits rows go to their requests.
void Scheduler::take_results(std::span<const PassPart> parts) {
  size_t row = 0;
  for (const PassPart& part : parts) {
    if (part.proposed > 0) {
      check_proposals(part, row);
      row += size_t(part.count);
      continue;
    }
    Slot& slot = slots_[part.slot];
    const ActiveRequest& request = *active_[part.slot];
    size_t begin = slot.tokens.size();
    slot.tokens.insert(slot.tokens.end(), request.sequence.begin() + begin,
                       request.sequence.begin() + begin + part.count);
    slot.kv_high = std::max<int64_t>(slot.kv_high, int64_t(slot.tokens.size()));
    keep_captures(part.slot);
    if (!part.logits) continue;
    std::span<float> logits(logits_.data() + row * vocab_size_, vocab_size_);
    ++row;
    try {
      on_logits(part.slot, logits);
    } catch (const std::exception& e) {  // this request's problem only; the others go on
      if (active_[part.slot]) finish(part.slot, FinishReason::error, "generation failed: " + what(e));
    }
  }
}

// The snapshots the pass took of a slot's state join its session.
void Scheduler::keep_captures(int slot_index) {
  Slot& slot = slots_[slot_index];
  int64_t taken = 0;
  for (auto& [slot_of, snapshot] : captures_)
    if (slot_of == slot_index && snapshot.state && snapshot.position <= int64_t(slot.tokens.size())) {
      add_snapshot(slot.snapshots, std::move(snapshot));
      ++taken;
    }
  if (taken == 0) return;
  std::erase_if(active_[slot_index]->captures,
                [&](const PlannedCapture& c) { return c.position <= int64_t(slot.tokens.size()); });
  const size_t before = slot.snapshots.size();
  thin_snapshots(slot.snapshots, options_.state_snapshot_interval);
  store_->count_hot_snapshots(taken, 0, int64_t(before - slot.snapshots.size()));
}

// A slot's group of speculative tokens: its next token and part.proposed proposals, a row of
// logits each. Row i chooses the token after token i, exactly as a decode step would (on_logits
// with the proposal: greedy takes the argmax, sampling the rejection rule); proposal i + 1 is
// kept while it is that choice. The slot keeps the tokens up to the last kept one; the model
// and the draft model drop the rest.
void Scheduler::check_proposals(const PassPart& part, size_t first_row) {
  const int s = part.slot;
  Slot& slot = slots_[s];
  const Proposer proposer = active_[s]->proposer;
  const std::vector<int32_t>& proposed = proposals_[s];
  const int64_t begin = int64_t(slot.tokens.size());
  slot.tokens.push_back(active_[s]->sequence[size_t(begin)]);
  // Counted as it goes: a request that ends here publishes the metrics.
  EngineMetrics::Speculative& counts = local_metrics_.speculative[int(proposer)];
  ++counts.checks;
  counts.proposed += part.proposed;
  int64_t kept = 0;
  for (int64_t i = 0; i <= part.proposed; ++i) {
    std::span<float> logits(logits_.data() + (first_row + size_t(i)) * vocab_size_, vocab_size_);
    const int32_t proposal = i < part.proposed ? proposed[size_t(i)] : -1;
    int32_t chosen = -1;
    try {
      chosen = on_logits(s, logits, proposal);
    } catch (const std::exception& e) {  // this request's problem only; the others go on
      if (active_[s]) finish(s, FinishReason::error, "generation failed: " + what(e));
    }
    if (!active_[s] || proposal < 0 || chosen != proposal) break;  // a request that ended keeps no more
    slot.tokens.push_back(proposal);
    ++kept;
    ++counts.accepted;
  }
  slot.kv_high = std::max<int64_t>(slot.kv_high, begin + 1 + part.proposed);
  model_.accept(s, begin + 1 + kept);
  drafter_->accepted(s, begin + 1 + kept);
  if (active_[s]) active_[s]->speculation.record(int(part.proposed), int(kept));
}

// Samples the slot's next token (keeping `proposal` when it passes, speculative decoding) and
// streams what it completes. Returns the token.
int32_t Scheduler::on_logits(int slot, std::span<float> logits, int32_t proposal) {
  ActiveRequest& request = *active_[slot];
  Sampler& sampler = samplers_[slot];
  const auto now = Clock::now();
  if (request.generated == 0)
    observe(local_metrics_.time_to_first_token, seconds_between(request.submitted, now));
  else
    observe(local_metrics_.inter_token_latency, seconds_between(request.last_token, now));
  request.last_token = now;

  // The scripted test hook replaces sampling; past its end the request stops as at eos.
  const std::vector<int32_t>* script = request.script;
  if (script && request.generated >= int64_t(script->size())) {
    end_at_stop_token(slot);
    return -1;
  }
  // A constraint masks the logits in place; when nothing may follow, the output ends.
  TokenConstraint* constraint = script ? nullptr : request.constraint.get();
  if (constraint && !constraint->mask(logits, request.max_new - request.generated)) {
    constraint->complete() ? end_at_stop_token(slot) : finish(slot, FinishReason::length);
    return -1;
  }
  // Rows past the tokenizer's last id pad the embedding (Qwen3: 151,936 rows, 151,669 ids): never sampled.
  std::fill(logits.begin() + std::min<int64_t>(tokenizer_.vocab_size(), int64_t(logits.size())),
            logits.end(), -INFINITY);
  if (script && options_.scripted_token_seconds > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(options_.scripted_token_seconds));
  int32_t token = script ? (*script)[request.generated] : sampler.sample(logits, proposal);
  if (constraint) constraint->accept(token);
  StreamEvent event;
  if (request.request.sampling.top_logprobs >= 0) {
    event.logprobs.emplace_back();
    sampler.logprobs(logits, token, event.logprobs.back());
  }
  sampler.accept(token);
  ++request.generated;
  ++local_metrics_.generation_tokens_total;

  // Stop tokens end the request without appearing in its text or ids.
  bool is_eos = !request.request.ignore_eos && contains(options_.eos_token_ids, token);
  if (is_eos || contains(request.request.stop_token_ids, token)) {
    end_at_stop_token(slot);
    return token;
  }

  request.sequence.push_back(token);
  event.ids.push_back(token);
  event.text = request.stop.push(decode_next(request.detokenizer, tokenizer_, token));
  bool at_limit = request.generated >= request.max_new;
  bool complete = constraint && constraint->finished();  // nothing may follow: no eos needed
  if ((at_limit || complete) && !request.stop.stopped())
    event.text += request.stop.push(request.detokenizer.flush()) + request.stop.flush();
  request.stream->push(std::move(event));
  if (request.stop.stopped() || complete)
    finish(slot, FinishReason::stop);
  else if (at_limit)
    finish(slot, FinishReason::length);
  return token;
}

// Ends at a stop token: the text held back (an unfinished character, a stop-string prefix that
// never completed) is emitted first.
void Scheduler::end_at_stop_token(int slot) {
  ActiveRequest& request = *active_[slot];
  StreamEvent event;
  event.text = request.stop.push(request.detokenizer.flush()) + request.stop.flush();
  if (!event.text.empty()) request.stream->push(std::move(event));
  finish(slot, FinishReason::stop);
}

// Ends the slot's request; the slot keeps the tokens whose KV it wrote.
void Scheduler::finish(int slot_index, FinishReason reason, const std::string& error) {
  std::unique_ptr<ActiveRequest> request = std::move(active_[slot_index]);
  StreamEvent event = end_event(reason, error);
  event.prompt_tokens = request->prompt_len;
  event.completion_tokens = request->generated;
  event.cached_tokens = request->cached;
  observe(local_metrics_.e2e_latency, seconds_between(request->submitted, Clock::now()));
  ++local_metrics_.requests_finished_total;

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
      const int64_t snapshot_bytes = int64_t(slot.snapshots.size() * state_bytes_);
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
