#pragma once
// A slot's sequence memory: all that a model keeps of a sequence between passes.
//   - the KV rows of its attention layers (kv_cache.h);
//   - the recurrent state of its recurrent layers (recurrent_state.h) and where that state ends
//     (the position its next pass may continue at);
//   - its open group of speculative tokens, and what rolls the state back over the rejected
//     ones (state_rollback.h);
//   - what an architecture keeps per slot beside these (a SlotMemoryUser: the MTP head's
//     hidden states).
// The forward reads and writes it through kv() and state(); the engine copies it in and out as
// opaque byte ranges (Model::kv_ranges, Model::state_ranges). The rules it enforces are those
// of model.h: a slot with a recurrent state continues only where its state ends (or starts over
// at 0), and speculative tokens stay open until accept().
#include <cstdint>
#include <span>
#include <vector>

#include "base/threads.h"
#include "model/memory/kv_cache.h"
#include "model/memory/recurrent_state.h"
#include "model/memory/state_rollback.h"
#include "model/model.h"

namespace ellm {

// Per-slot memory an architecture keeps beside the KV and the state, told what happens to the
// slot's sequence.
class SlotMemoryUser {
 public:
  virtual ~SlotMemoryUser() = default;
  virtual void rewritten(int slot) = 0;  // KV was copied into the slot from elsewhere
  virtual void released(int slot, int64_t from_position) = 0;
  virtual void accepted(int slot, int64_t end) = 0;  // a speculative group was cut at `end`
  virtual void forgotten(int slot) = 0;              // a pass over the slot failed
};

struct MemoryShape {
  int64_t kv_layers = 0, kv_heads = 0, head_dim = 0;
  RecurrentShape recurrent;  // recurrent.layers == 0 and no windows: no recurrent state
  int64_t kv_extra_floats = 0;  // FP32 values per position beside K and V in each KV layer
};

class SequenceMemory {
 public:
  SequenceMemory() = default;
  SequenceMemory(const MemoryShape& shape, const ServingLimits& limits);

  KvCache& kv() { return kv_; }
  const KvCache& kv() const { return kv_; }
  RecurrentState& state() { return state_; }
  const RecurrentState& state() const { return state_; }
  bool has_state() const { return has_state_; }
  const StateRollback& rollback() const { return rollback_; }
  void attach(SlotMemoryUser* user) { user_ = user; }

  // Before a pass: checks that its tokens continue each slot by the rules above (throws, with
  // nothing changed, when not), then moves each slot's state end and group past the pass. A
  // slot starting over at 0 gets an empty state; a group opening here saves the state first.
  void claim(std::span<const BatchToken> tokens);
  // After a pass over these tokens failed: their slots' states and groups are garbage.
  void forget(std::span<const BatchToken> tokens);
  // Model::accept, on every member of the team.
  void accept(int slot, int64_t end, ThreadTeam& team);
  // Where speculative token `position` of the slot's open group sits in it.
  int64_t group_index(int slot, int64_t position) const { return position - groups_[slot].begin; }

  void kv_ranges(int slot, int64_t begin, int64_t end, bool for_write, ThreadTeam& team,
                 std::vector<std::span<uint8_t>>& out);
  void release(int slot, int64_t from_position);
  void state_ranges(int slot, bool for_write, std::vector<std::span<uint8_t>>& out);
  void set_state_end(int slot, int64_t position);
  int64_t state_end(int slot) const;

 private:
  // A slot's speculative tokens since its last accept(): positions [begin, begin + count).
  struct SpeculativeGroup {
    int64_t begin = 0, count = 0;
  };
  void check_groups(std::span<const BatchToken> tokens);
  void claim_state(std::span<const BatchToken> tokens);
  void claim_groups();
  void check_slot(const char* what, int slot) const;

  int64_t n_slots_ = 0, max_positions_ = 0, group_capacity_ = 1;
  KvCache kv_;
  bool has_state_ = false;
  RecurrentState state_;
  std::vector<int64_t> state_end_;  // [slot]  tokens folded into its state (-1: garbage)
  std::vector<int64_t> claim_end_;  // [slot]  claim_state's scratch
  std::vector<char> claim_reset_;   // [slot]
  std::vector<SpeculativeGroup> groups_, claimed_groups_;  // [slot]; claimed: check_groups' result
  std::vector<char> group_opens_;                          // [slot]  a group opens in this pass
  StateRollback rollback_;  // with a state and speculative tokens: the states groups start from
  SlotMemoryUser* user_ = nullptr;
};

}  // namespace ellm
