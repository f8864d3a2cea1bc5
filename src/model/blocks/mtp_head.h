#pragma once
// Qwen3.5's multi-token-prediction head (docs/models/qwen35.md), which drafts tokens for
// speculative decoding. From the model's final-normed hidden state h_i at position i and the
// token x_{i+1} after it:
//   u = fc([norm_e(embed(x_{i+1})) | norm_h(h_i)])        embedding first, both norms (1 + w)
//   g = the head's decoder layer over u at position i      a gated full-attention layer with its
//                                                          own KV (an extra KV layer)
//   logits(x_{i+2}) = lm_head(norm(g))                     the model's lm_head
// Further drafts feed norm(g) back as the hidden state, with the draft as the token.
//
// Positions: the pair (h_i, x_{i+1}) sits at position i (as vLLM places it; RoPE attention
// depends only on distances). So the head's KV at i needs the token after i: every pass runs
// the head over the pairs its tokens complete (each token with the hidden state before it) and
// keeps its slots' last hidden states for the next pass; a draft starts from them. Those
// hidden states are per-slot memory beside the KV: the head is a SlotMemoryUser.
#include <cstdint>
#include <span>
#include <vector>

#include "model/blocks/context.h"
#include "model/load/tensor_loader.h"
#include "model/memory/sequence_memory.h"
#include "model/rope.h"

namespace ellm {

struct MtpWeights {
  PackedWeights fc;                                 // [hidden][2 hidden]
  Buffer<float> norm_embedding, norm_hidden, norm;  // [hidden], (1 + w)
};

// mtp.fc and mtp's pre_fc_norm_embedding, pre_fc_norm_hidden and norm (its decoder layer is the
// architecture's to read).
MtpWeights load_mtp(TensorLoader& load, int64_t hidden, NormReader norm);

struct MtpSpec {
  int64_t hidden = 0, angle_stride = 0;  // angle_stride: head_dim / 2
  float eps = 1e-6f;
  const bf16* embedding = nullptr;  // [vocab][hidden], the model's
  const RopeTable* rope = nullptr;  // the model's
};

class MtpHead final : public SlotMemoryUser {
 public:
  // Per slot room for a group of max_group hidden states.
  void init(const MtpSpec& spec, int64_t batch, int64_t max_group);
  void plan(ActivationPlan& plan, size_t max_tokens);

  // After a pass: h = final_norm(x) for every row (into xn, [n][H]); the head's input rows for
  // the pairs the pass completed, with their RoPE angles (written over the rows' own: the pass
  // is done with them); each slot's last hidden states kept (a group's all). Returns the number
  // of pairs, the rows the head's layer then runs over (tokens(), inputs()).
  int64_t after_pass(BlockContext& ctx, const MtpWeights& w, const float* final_norm,
                     const PassRows& rows, float* xn);
  // A draft: for each token, the hidden state it continues (a slot's kept one, or the head's
  // previous output), checked, and the head's input rows. Throws when a slot has none.
  void draft_inputs(BlockContext& ctx, const MtpWeights& w, std::span<const BatchToken> tokens,
                    float* rope_cos, float* rope_sin);
  // After the head's layer over a draft's rows x: norm(x) kept as each slot's next hidden
  // state, and as BF16 into xb for the lm_head.
  void draft_outputs(const MtpWeights& w, std::span<const BatchToken> tokens, const float* x, bf16* xb);

  std::span<const BatchToken> tokens(int64_t n) const { return std::span(tokens_).first(size_t(n)); }
  const bf16* inputs() const { return in_; }

  void rewritten(int slot) override;
  void released(int slot, int64_t from_position) override;
  void accepted(int slot, int64_t end) override;
  void forgotten(int slot) override { rows_[slot] = 0; }

 private:
  const float* saved_hidden(int slot, int64_t position) const;
  void inputs_for(BlockContext& ctx, const MtpWeights& w, int64_t n, float* rope_cos, float* rope_sin);

  MtpSpec spec_;
  int64_t capacity_ = 0;
  // Per slot the final-normed hidden states of its last pass (the group's rows, or the last
  // row) at positions [first_, first_ + rows_), and the head's own output after its last draft
  // row, at chain_position_.
  Buffer<float> hidden_;  // [batch][capacity][hidden]
  Buffer<float> chain_;   // [batch][hidden]
  std::vector<int64_t> first_, rows_, chain_position_;  // [batch]
  // The head's rows of one pass or draft: [norm_e(embedding) | norm_h(hidden)], FP32 scratch,
  // its tokens and the hidden state each pairs with.
  bf16* in_;                                // [T][2 hidden]
  float* scratch_;                          // [T][hidden]
  std::vector<BatchToken> tokens_;          // [T]
  std::vector<const float*> pair_hidden_;   // [T]
};

}  // namespace ellm
