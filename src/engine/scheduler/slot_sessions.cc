#include "engine/scheduler/slot_sessions.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "base/error.h"
#include "base/hash.h"
#include "base/log.h"
#include "model/model.h"

namespace ellm {

void add_planned_snapshot(std::vector<PlannedSnapshot>& planned, PlannedSnapshot snapshot) {
  auto at = std::find_if(planned.begin(), planned.end(),
                         [&](const PlannedSnapshot& p) { return p.position >= snapshot.position; });
  if (at != planned.end() && at->position == snapshot.position)
    at->shared = at->shared || snapshot.shared;
  else
    planned.insert(at, snapshot);
}

SlotSessions::SlotSessions(Model& model, const EngineOptions& options)
    : model_(model),
      snapshot_interval_(options.state_snapshot_interval),
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
    slot.tokens.reserve(model.limits().sequence_length);
    slots_.push_back(std::move(slot));
  }
  if (options.session_cache) {
    SessionStoreOptions store;
    std::vector<std::span<uint8_t>> probe;
    model.kv_ranges(0, 0, 1, false, probe);
    store.identity.n_ranges = probe.size();
    store.identity.row_bytes = probe.empty() ? 0 : probe[0].size();
    store.identity.fingerprint = model.fingerprint();
    const std::string format = model.kv_format();
    store.identity.format_hash = hash_bytes(format.data(), format.size());
    store.identity.state_bytes = state_bytes_;
    store.identity.kv_dtype = uint64_t(model.limits().kv_dtype);
    store.snapshot_interval = options.state_snapshot_interval;
    store.memory_bytes = options.session_memory_bytes;
    store.dir = options.session_dir;
    store.disk_bytes = options.session_disk_bytes;
    store_ = std::make_unique<SessionStore>(std::move(store));
  }
}

// Before the slot's KV is overwritten. A hybrid model's session goes with its snapshots and one
// of its live state, where its next turn resumes.
void SlotSessions::save(const Slot& slot, int64_t keep) {
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

// Its KV may be half written, or it is saved already.
void SlotSessions::forget(Slot& slot) {
  slot.tokens.clear();  // first: if releasing fails, no request may reuse this KV
  slot.prompt_len = 0;
  drop_snapshots(slot, 0);
  if (slot.kv_high > 0) model_.release_kv(slot.index, 0);
  slot.kv_high = 0;
}

// They are saved already, or of no more use.
void SlotSessions::drop_snapshots(Slot& slot, int64_t above) {
  const size_t before = slot.snapshots.size();
  std::erase_if(slot.snapshots, [&](const StateSnapshot& s) { return s.position > above; });
  if (store_ && before > slot.snapshots.size()) store_->count_hot_snapshots(0, 0, int64_t(before - slot.snapshots.size()));
}

void SlotSessions::evict(Slot& slot) {
  save(slot, 0);
  forget(slot);
}

// Evicts idle sessions other than `chosen` and `keep` (a restore's source), least recently used
// first, to the store, until `need` more positions fit under the KV budget.
bool SlotSessions::make_room(int chosen, int keep, int64_t need) {
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

// For a hybrid model, the state at `reuse` comes with the KV: a snapshot's, or the source's
// live state.
void SlotSessions::copy_from_slot(Slot& slot, int source, int64_t reuse) {
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

// The state is a snapshot's copy, or the live state of slot `source` when no snapshot is there
// (it ends there).
void SlotSessions::restore_state(Slot& slot, const StateSnapshot* snapshot, int source, int64_t position) {
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

// Where the conversation so far ends (the next turn resumes there), at the end of the prefix
// another session shares and where the system messages end (where the next conversation with
// the same start resumes: the first one has no other session to share with yet), and every
// interval positions (where any other may); and before each image, so that a conversation whose
// screenshot changed resumes right before it.
std::vector<PlannedSnapshot> SlotSessions::plan_snapshots(int64_t reuse, int64_t common, int64_t history_end,
                                                          int64_t system_end, int64_t reusable,
                                                          const std::vector<PromptImage>& images) const {
  std::vector<PlannedSnapshot> planned;
  if (!hybrid_ || !store_) return planned;
  const int64_t interval = snapshot_interval_;
  if (interval > 0)
    for (int64_t p = (reuse / interval + 1) * interval; p <= reusable; p += interval) planned.push_back({p, false});
  if (history_end > reuse && history_end <= reusable) add_planned_snapshot(planned, {history_end, false});
  if (common - reuse >= SessionStore::kBlock && common <= reusable) add_planned_snapshot(planned, {common, true});
  if (system_end - reuse >= SessionStore::kBlock && system_end <= reusable)
    add_planned_snapshot(planned, {system_end, true});
  for (const PromptImage& image : images)
    if (image.first > reuse && image.first <= reusable) add_planned_snapshot(planned, {image.first, false});
  return planned;
}

}  // namespace ellm
