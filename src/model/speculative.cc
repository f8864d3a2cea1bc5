// Speculative groups (Model::accept): a slot's tokens being checked, which the engine keeps only
// up to the first one it rejects. The KV rows of rejected tokens are simply written over later;
// a hybrid model's recurrent state is rolled back (gdn_rollback.h).
#include <cstring>

#include "base/error.h"
#include "model/qwen3.h"

namespace ellm {

void Qwen3Model::check_groups(std::span<const BatchToken> tokens) {
  std::copy(spec_.begin(), spec_.end(), spec_claim_.begin());
  std::fill(spec_opens_.begin(), spec_opens_.end(), 0);
  const int64_t capacity = limits_.speculative_tokens + 1;
  for (const BatchToken& t : tokens) {
    SpeculativeGroup& group = spec_claim_[t.slot];
    const std::string slot = "slot " + std::to_string(t.slot);
    if (t.position == 0) group = {};  // the slot starts over
    if (!t.speculative) {
      if (group.count > 0)
        fail("forward", slot + " has speculative tokens waiting for accept()");
      spec_opens_[t.slot] = 2;  // plain tokens: no group may open after them in this pass
      continue;
    }
    if (capacity == 1)
      fail("forward", "speculative tokens, but the model was loaded with speculative_tokens = 0");
    if (group.count == 0) {
      if (spec_opens_[t.slot] == 2)
        fail("forward", slot + ": speculative tokens must come before its plain ones in a pass");
      group.begin = t.position;
      spec_opens_[t.slot] = 1;
    }
    if (t.position != group.begin + group.count)
      fail("forward", slot + ": speculative token at position " + std::to_string(t.position) +
                          " does not follow its group (next " + std::to_string(group.begin + group.count) + ")");
    if (group.count == capacity)
      fail("forward", slot + ": more than " + std::to_string(capacity) +
                          " speculative tokens before accept() (speculative_tokens + 1)");
    ++group.count;
  }
}

// After claim_state (which resets the states of slots starting over): a new group starts from
// the state as it is now.
void Qwen3Model::claim_groups() {
  for (int64_t slot = 0; slot < limits_.batch_size; ++slot)
    if (spec_opens_[slot] == 1 && !rollback_.empty()) rollback_.save(state_, slot);
  std::copy(spec_claim_.begin(), spec_claim_.end(), spec_.begin());
}

void Qwen3Model::close_group(int slot) { spec_[slot] = {}; }

void Qwen3Model::accept(int slot, int64_t end) {
  if (slot < 0 || slot >= limits_.batch_size)
    fail("accept", "slot " + std::to_string(slot) + " does not exist");
  if (pass_.open && pass_.has_slot[slot])
    fail("accept", "slot " + std::to_string(slot) + " is in the pass in progress");
  const SpeculativeGroup group = spec_[slot];
  if (group.count == 0) {
    if (config_.is_hybrid() && end != state_end_[slot])
      fail("accept", "slot " + std::to_string(slot) + " has no speculative tokens to cut at " +
                         std::to_string(end));
    return;
  }
  if (end < group.begin || end > group.begin + group.count)
    fail("accept", "slot " + std::to_string(slot) + ": position " + std::to_string(end) +
                       " is outside its speculative tokens [" + std::to_string(group.begin) + ", " +
                       std::to_string(group.begin + group.count) + "]");
  if (config_.is_hybrid() && end < group.begin + group.count && state_end_[slot] >= 0) {
    rollback_.restore(state_, slot, end - group.begin, team_);
    state_end_[slot] = end;
  }
  if (limits_.mtp) mtp_accept(slot, end);
  close_group(slot);
}

// What a Gated DeltaNet layer took in for each speculative token of the rows (called between
// its gates and its delta rule): the conv input (in_proj_qkv row), q | k | v, g and beta.
void Qwen3Model::record_speculative(int64_t layer, const PassRows& r) {
  if (rollback_.empty()) return;
  const ModelConfig& c = config_;
  const int64_t CD = c.conv_dim(), P = CD + c.linear_value_dim(), Hv = c.linear_num_value_heads;
  const int64_t state_layer = gdn_layer_[layer];
  for (int64_t t = 0; t < int64_t(r.tokens.size()); ++t) {
    const BatchToken& token = r.tokens[t];
    if (!token.speculative) continue;
    const int64_t index = token.position - spec_[token.slot].begin;
    std::memcpy(rollback_.conv_input(state_layer, token.slot, index), act_.gdn_qkvz + t * P,
                size_t(CD) * sizeof(float));
    std::memcpy(rollback_.delta_qkv(state_layer, token.slot, index), act_.gdn_u + t * CD,
                size_t(CD) * sizeof(float));
    std::memcpy(rollback_.log_decay(state_layer, token.slot, index), act_.gdn_g + t * Hv,
                size_t(Hv) * sizeof(float));
    std::memcpy(rollback_.beta(state_layer, token.slot, index), act_.gdn_beta + t * Hv,
                size_t(Hv) * sizeof(float));
  }
}

}  // namespace ellm
