#pragma once
// Rolling back the recurrent state of a hybrid model (Qwen3.5+) over speculative tokens that
// were checked and rejected. Rejected tokens must never reach the Gated DeltaNet state, which
// folds in everything it is fed. So when a slot's group of speculative tokens begins, its state
// is copied aside, and each Gated DeltaNet layer records what every token of the group gave the
// conv window and the delta rule (small: a few rows per layer, no weights). Accepting the first
// `keep` tokens then restores the copy and folds in only those again: the conv window from the
// recorded inputs, the delta rule by the same recurrence steps the pass ran for them (a short
// group of tokens runs the recurrence, token by token), so the state is bit for bit what
// feeding the accepted tokens alone leaves.
//
// Per slot, beside RecurrentState:
//   saved    [state floats of a slot]                       the state before the group
//   inputs   [gdn layers][max tokens][CD | CD | Hv | Hv]    per token: the conv input (in_proj_qkv
//            row), the delta rule's q | k | v (after conv, SiLU, L2 norms), log-decay g, beta
//   rows     [windows][max tokens][window_row_floats]       per token: the row it pushed into
//            each of the slot's sliding windows (RecurrentShape::windows)
#include <cstdint>

#include "base/memory.h"
#include "base/threads.h"
#include "model/memory/recurrent_state.h"

namespace ellm {

class StateRollback {
 public:
  StateRollback() = default;
  // Room for groups of up to max_tokens tokens in each of n_slots slots.
  StateRollback(const RecurrentShape& shape, int64_t n_slots, int64_t max_tokens);
  bool empty() const { return max_tokens_ == 0; }

  // The slot's state now, as the state its group starts from.
  void save(const RecurrentState& state, int64_t slot);
  // Where a layer records token `index` of the slot's group.
  float* conv_input(int64_t layer, int64_t slot, int64_t index) const { return row(layer, slot, index); }
  float* delta_qkv(int64_t layer, int64_t slot, int64_t index) const {
    return row(layer, slot, index) + shape_.conv_dim;
  }
  float* log_decay(int64_t layer, int64_t slot, int64_t index) const {
    return row(layer, slot, index) + 2 * shape_.conv_dim;
  }
  float* beta(int64_t layer, int64_t slot, int64_t index) const {
    return log_decay(layer, slot, index) + shape_.value_heads;
  }
  // Where token `index` of the slot's group records the row it pushed into sliding window w.
  float* window_row(int64_t w, int64_t slot, int64_t index) const {
    return rows_.get() + ((slot * shape_.windows + w) * max_tokens_ + index) * shape_.window_row_floats;
  }
  // The slot's state after the first `keep` tokens of its group: the saved state with those
  // tokens folded in again, on every member of the team.
  void restore(RecurrentState& state, int64_t slot, int64_t keep, ThreadTeam& team) const;
  size_t bytes() const { return bytes_; }

 private:
  float* row(int64_t layer, int64_t slot, int64_t index) const {
    return inputs_.get() + ((slot * shape_.layers + layer) * max_tokens_ + index) * row_floats_;
  }
  RecurrentShape shape_;
  int64_t max_tokens_ = 0, row_floats_ = 0, state_floats_ = 0;
  Buffer<float> saved_, inputs_, rows_;
  size_t bytes_ = 0;
};

}  // namespace ellm
