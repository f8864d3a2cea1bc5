// Placing a queued request in a slot: where its prefix comes from (a slot, busy or idle, or the
// session store on the restorer thread), which slot it takes, and starting it there. The
// sessions the slots hold move through SlotSessions (slot_sessions.h).
#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <mutex>
#include <span>
#include <string>

#include "base/log.h"

namespace ellm {

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
      queued.stream->push(end_event(FinishReason::error, std::string("could not start the request: ") + e.what()));
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
  const bool hybrid = sessions_.hybrid();
  for (Slot& slot : slots_) slot.state_end = model_.state_end(slot.index);
  SlotMatch hot = use_cache ? best_slot_match(slots_, prompt, reusable, hybrid) : SlotMatch{};
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
      if (!hybrid) return Placement::defer;
      if (shared > written && store_) {
        add_planned_snapshot(other->snapshots, {shared, true});
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
  sessions_.save(slot, in_place ? reuse : 0);
  const bool state_in_place = in_place && slot.state_end == reuse;
  slot.tokens.resize(in_place ? reuse : 0);
  sessions_.drop_snapshots(slot, in_place ? reuse : 0);
  slot.prompt_len = std::min<int64_t>(slot.prompt_len, int64_t(slot.tokens.size()));

  // Committed KV: evict idle sessions (LRU, to the store) before refusing anyone. The snapshots
  // its prefill will take count too.
  std::vector<PlannedSnapshot> snapshots =
      sessions_.plan_snapshots(reuse, common, queued.request.history_end, queued.request.system_end, reusable,
                               queued.request.images);
  int64_t reserve = int64_t(prompt.size()) + queued.max_new + int64_t(snapshots.size()) * sessions_.snapshot_positions();
  const int64_t own = int64_t(slot.snapshots.size()) * sessions_.snapshot_positions();
  if (!sessions_.make_room(slot.index, source, std::max(reserve, slot.kv_high) + own)) {
    if (slot.kv_high > reserve) {
      model_.release_kv(slot.index, reserve);
      slot.kv_high = reserve;
    }
    if (!sessions_.make_room(slot.index, source, reserve + own)) {
      // Running requests (and those being restored) will give their reservations back.
      if (running_ > 0 || !restoring_.empty()) return Placement::wait;
      const double per_token = double(model_.kv_bytes_per_token());
      queued.stream->push(end_event(
          FinishReason::error, "KV memory budget exceeded: the request needs " + format_mib(reserve * per_token) +
                       " of KV cache, the budget is " + format_mib(sessions_.budget_positions() * per_token)));
      return Placement::placed;
    }
  }
  if (from_store && reuse > 0) {
    restore_in_background(slot, std::move(queued), std::move(plan), reserve, common, std::move(snapshots));
    return Placement::placed;
  }
  if (reuse > 0 && !in_place) {
    sessions_.copy_from_slot(slot, source, reuse);
  } else if (reuse > 0) {  // in place: the rows are there; a hybrid's state too, or in a snapshot
    const auto start = Clock::now();
    if (hybrid && !state_in_place) sessions_.restore_state(slot, snapshot_at_or_before(slot.snapshots, reuse), -1, reuse);
    store_->count_hot_hit(reuse, hybrid && !state_in_place ? int64_t(sessions_.state_bytes()) : 0,
                          seconds_between(start, Clock::now()));
  }
  occupy(slot, reserve);
  start(slot, std::move(queued), reuse, common, std::move(snapshots));
  return Placement::placed;
}

// Copies a stored prefix into the slot on the restorer thread: the slot's KV pages are
// committed here (the model's thread team does it), the bytes are copied or read there, and the
// request starts once they are in place (finish_restores), while other slots keep decoding.
void Scheduler::restore_in_background(Slot& slot, QueuedRequest&& queued, RestorePlan plan, int64_t reserve,
                                      int64_t common, std::vector<PlannedSnapshot> snapshots) {
  auto pending = std::make_unique<PendingRestore>();
  PendingRestore* job = pending.get();
  job->queued = std::move(queued);
  job->slot = slot.index;
  job->reserve = reserve;
  job->common = common;
  job->snapshots = std::move(snapshots);
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
                         double(sessions_.hybrid() ? sessions_.state_bytes() : 0);
    char line[160];
    std::snprintf(line, sizeof line, "sessions: restored %lld tokens from %s into slot %d in %.1f ms (%.2f GB/s)",
                  static_cast<long long>(job->restored), tier_name(job->plan.match.tier), slot.index, seconds * 1e3,
                  bytes / std::max(seconds, 1e-9) / 1e9);
    log_info(line);
    if (sessions_.hybrid()) {
      model_.set_state_end(slot.index, job->restored);
      slot.snapshots = std::move(job->inherited);
      thin_snapshots(slot.snapshots, options_.state_snapshot_interval);
    }
    start(slot, std::move(job->queued), job->restored, job->common, std::move(job->snapshots));
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
                      std::vector<PlannedSnapshot> snapshots) {
  const auto& prompt = queued.request.prompt;
  const int64_t n_prompt = int64_t(prompt.size());
  slot.tokens.assign(prompt.begin(), prompt.begin() + reuse);
  samplers_[slot.index].start(queued.request.sampling, prompt);
  local_metrics_.images_total += int64_t(queued.request.images.size());
  active_[slot.index] = std::make_unique<ActiveRequest>(tokenizer_, std::move(queued), reuse);
  if (const auto& scripts = options_.scripted_outputs; !scripts.empty())
    active_[slot.index]->script = &scripts[std::min(scripts_started_++, scripts.size() - 1)];
  active_[slot.index]->snapshots = std::move(snapshots);
  slot.prompt_len = n_prompt;
  ++running_;
  local_metrics_.prompt_tokens_total += n_prompt;
  local_metrics_.cached_tokens_total += reuse;
  local_metrics_.recomputed_tokens_total += std::max<int64_t>(0, common - reuse);
}

}  // namespace ellm
