#include "model/memory/sequence_memory.h"

#include <algorithm>
#include <string>

#include "base/error.h"

namespace ellm {

SequenceMemory::SequenceMemory(const MemoryShape& shape, const ServingLimits& limits)
    : n_slots_(limits.batch_size),
      max_positions_(limits.sequence_length),
      group_capacity_(limits.speculative_tokens + 1),
      kv_(shape.kv_layers, limits.batch_size, shape.kv_heads, limits.sequence_length, shape.head_dim,
          shape.kv_extra_floats, limits.kv_dtype),
      has_state_(shape.recurrent.layers > 0 || shape.recurrent.extra_floats() > 0) {
  const size_t slots = size_t(n_slots_);
  if (has_state_) {
    state_ = RecurrentState(shape.recurrent, n_slots_);
    state_end_.assign(slots, 0);
    if (limits.speculative_tokens > 0)
      rollback_ = StateRollback(shape.recurrent, n_slots_, group_capacity_);
  }
  claim_end_.assign(slots, 0);
  claim_reset_.assign(slots, 0);
  groups_.assign(slots, {});
  claimed_groups_.assign(slots, {});
  group_opens_.assign(slots, 0);
}

void SequenceMemory::claim(std::span<const BatchToken> tokens) {
  check_groups(tokens);
  claim_state(tokens);
  claim_groups();
}

// Speculative groups: checks that the pass extends them (and opens new ones) by the rules of
// Model::accept, into claimed_groups_.
void SequenceMemory::check_groups(std::span<const BatchToken> tokens) {
  std::copy(groups_.begin(), groups_.end(), claimed_groups_.begin());
  std::fill(group_opens_.begin(), group_opens_.end(), 0);
  for (const BatchToken& t : tokens) {
    SpeculativeGroup& group = claimed_groups_[t.slot];
    const std::string slot = "slot " + std::to_string(t.slot);
    if (t.position == 0) group = {};  // the slot starts over
    if (!t.speculative) {
      if (group.count > 0)
        fail("forward", slot + " has speculative tokens waiting for accept()");
      group_opens_[t.slot] = 2;  // plain tokens: no group may open after them in this pass
      continue;
    }
    if (group_capacity_ == 1)
      fail("forward", "speculative tokens, but the model was loaded with speculative_tokens = 0");
    if (group.count == 0) {
      if (group_opens_[t.slot] == 2)
        fail("forward", slot + ": speculative tokens must come before its plain ones in a pass");
      group.begin = t.position;
      group_opens_[t.slot] = 1;
    }
    if (t.position != group.begin + group.count)
      fail("forward", slot + ": speculative token at position " + std::to_string(t.position) +
                          " does not follow its group (next " + std::to_string(group.begin + group.count) + ")");
    if (group.count == group_capacity_)
      fail("forward", slot + ": more than " + std::to_string(group_capacity_) +
                          " speculative tokens before accept() (speculative_tokens + 1)");
    ++group.count;
  }
}

// Checks that each slot of the pass continues where its state ends (or starts over at 0: then
// resets it), and moves the ends past the pass.
void SequenceMemory::claim_state(std::span<const BatchToken> tokens) {
  if (!has_state_) return;
  // Check every token first: a refused pass leaves every state as it was.
  std::copy(state_end_.begin(), state_end_.end(), claim_end_.begin());
  std::fill(claim_reset_.begin(), claim_reset_.end(), 0);
  for (const BatchToken& t : tokens) {
    int64_t& end = claim_end_[t.slot];
    if (t.position == 0) {
      claim_reset_[t.slot] = 1;
    } else if (t.position != end) {
      fail("forward", "slot " + std::to_string(t.slot) + " continues at position " +
                          std::to_string(t.position) + " but its recurrent state " +
                          (end < 0 ? std::string("is not valid") : "ends at " + std::to_string(end)) +
                          ": a hybrid model resumes a sequence only with its state");
    }
    end = t.position + 1;
  }
  for (int64_t slot = 0; slot < n_slots_; ++slot) {
    if (claim_reset_[slot]) state_.reset(slot);
    state_end_[slot] = claim_end_[slot];
  }
}

// After claim_state (which resets the states of slots starting over): a new group starts from
// the state as it is now.
void SequenceMemory::claim_groups() {
  for (int64_t slot = 0; slot < n_slots_; ++slot)
    if (group_opens_[slot] == 1 && !rollback_.empty()) rollback_.save(state_, slot);
  std::copy(claimed_groups_.begin(), claimed_groups_.end(), groups_.begin());
}

void SequenceMemory::forget(std::span<const BatchToken> tokens) {
  for (const BatchToken& t : tokens) {
    groups_[t.slot] = {};
    if (user_) user_->forgotten(t.slot);
    if (has_state_) state_end_[t.slot] = -1;
  }
}

void SequenceMemory::accept(int slot, int64_t end, ThreadTeam& team) {
  const SpeculativeGroup group = groups_[slot];
  if (group.count == 0) {
    if (has_state_ && end != state_end_[slot])
      fail("accept", "slot " + std::to_string(slot) + " has no speculative tokens to cut at " +
                         std::to_string(end));
    return;
  }
  if (end < group.begin || end > group.begin + group.count)
    fail("accept", "slot " + std::to_string(slot) + ": position " + std::to_string(end) +
                       " is outside its speculative tokens [" + std::to_string(group.begin) + ", " +
                       std::to_string(group.begin + group.count) + "]");
  if (has_state_ && end < group.begin + group.count && state_end_[slot] >= 0) {
    rollback_.restore(state_, slot, end - group.begin, team);
    state_end_[slot] = end;
  }
  if (user_) user_->accepted(slot, end);
  groups_[slot] = {};
}

void SequenceMemory::kv_ranges(int slot, int64_t begin, int64_t end, bool for_write,
                               ThreadTeam& team, std::vector<std::span<uint8_t>>& out) {
  if (slot < 0 || slot >= n_slots_ || begin < 0 || begin > end || end > max_positions_)
    fail("kv_ranges", "slot " + std::to_string(slot) + " positions [" + std::to_string(begin) + ", " +
                          std::to_string(end) + ") are outside the KV cache");
  if (for_write && end > 0) {
    kv_.commit(slot, end, team);
    kv_.note_written(slot, end);
    if (has_state_) state_end_[slot] = -1;  // KV written without its state
    groups_[slot] = {};
    if (user_) user_->rewritten(slot);
  }
  kv_.ranges(slot, begin, end, out);
}

void SequenceMemory::release(int slot, int64_t from_position) {
  check_slot("release_kv", slot);
  kv_.release(slot, std::max<int64_t>(from_position, 0));
  if (has_state_ && from_position < state_end_[slot]) state_end_[slot] = -1;
  if (from_position < groups_[slot].begin + groups_[slot].count) groups_[slot] = {};
  if (user_) user_->released(slot, from_position);
}

void SequenceMemory::state_ranges(int slot, bool for_write, std::vector<std::span<uint8_t>>& out) {
  check_slot("state_ranges", slot);
  if (!has_state_) return;
  if (for_write) state_end_[slot] = -1;
  state_.ranges(slot, out);
}

void SequenceMemory::set_state_end(int slot, int64_t position) {
  if (slot < 0 || slot >= n_slots_ || position < 0 || position > max_positions_)
    fail("set_state_end", "slot " + std::to_string(slot) + " position " + std::to_string(position) +
                              " is outside the cache");
  if (has_state_) state_end_[slot] = position;
}

int64_t SequenceMemory::state_end(int slot) const {
  if (slot < 0 || slot >= n_slots_ || !has_state_) return -1;
  return state_end_[slot];
}

void SequenceMemory::check_slot(const char* what, int slot) const {
  if (slot < 0 || slot >= n_slots_) fail(what, "slot " + std::to_string(slot) + " does not exist");
}

}  // namespace ellm
