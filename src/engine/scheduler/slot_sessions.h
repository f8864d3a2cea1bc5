#pragma once
// The sessions the slots hold, within the KV budget (ServingLimits::kv_memory_bytes): a slot's
// session saved to the session store before its KV is overwritten, dropped, or evicted to make
// room for another; a prefix's KV (and a hybrid model's state) copied into a slot from another
// slot or from a snapshot; and where a hybrid model's prefill is to take snapshots. Which slot
// a request takes is decided by slots.h, and when, by the scheduler (placement.cc). The
// scheduler thread's only: nothing here takes a lock (the store has its own).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "engine/scheduler/requests.h"
#include "engine/session_store.h"
#include "engine/slots.h"
#include "engine/snapshot.h"

namespace ellm {

class Model;

// Adds a planned snapshot, keeping them sorted with one per position.
void add_planned_snapshot(std::vector<PlannedSnapshot>& planned, PlannedSnapshot snapshot);

class SlotSessions {
 public:
  // Makes one slot per sequence the model runs at once, and the session store when
  // options.session_cache.
  SlotSessions(Model& model, const EngineOptions& options);

  std::vector<Slot>& slots() { return slots_; }
  SessionStore* store() const { return store_.get(); }  // null without the session cache
  // Hybrid models: the bytes of a slot's state, and what a snapshot of it costs in KV positions.
  bool hybrid() const { return hybrid_; }
  size_t state_bytes() const { return state_bytes_; }
  int64_t snapshot_positions() const { return snapshot_positions_; }
  int64_t budget_positions() const { return budget_positions_; }  // the KV budget; INT64_MAX: none

  // Copies a slot's session to the store when a client would send enough of it again (its
  // prompt tokens beyond the `keep` positions that stay).
  void save(const Slot& slot, int64_t keep);
  // Drops a slot's session and gives its KV pages back.
  void forget(Slot& slot);
  // Drops the slot's snapshots beyond position `above`.
  void drop_snapshots(Slot& slot, int64_t above);
  void evict(Slot& slot);  // save, then forget
  // Evicts idle sessions until `need` more positions fit under the budget; false if they cannot.
  bool make_room(int chosen, int keep, int64_t need);
  // Copies the first `reuse` positions of slot `source` (KV, and a hybrid's state) into the slot.
  void copy_from_slot(Slot& slot, int source, int64_t reuse);
  // Puts the state at `position` into a hybrid model's slot.
  void restore_state(Slot& slot, const StateSnapshot* snapshot, int source, int64_t position);
  // The snapshots a hybrid model's prefill of a prompt takes (none for other models).
  std::vector<PlannedSnapshot> plan_snapshots(int64_t reuse, int64_t common, int64_t history_end,
                                              int64_t system_end, int64_t reusable,
                                              const std::vector<PromptImage>& images) const;

 private:
  Model& model_;
  const int64_t snapshot_interval_;  // EngineOptions::state_snapshot_interval
  const int64_t budget_positions_;
  const bool hybrid_;
  const size_t state_bytes_;
  const int64_t snapshot_positions_;
  std::vector<Slot> slots_;
  std::unique_ptr<SessionStore> store_;
  // Scratch: the model's KV and state ranges of the slots being copied.
  std::vector<std::span<uint8_t>> kv_from_, kv_to_, state_from_, state_to_;
  std::vector<std::span<const uint8_t>> kv_out_;
};

}  // namespace ellm
