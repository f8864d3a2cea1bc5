// Qwen3.5's multi-token-prediction head (../shared/QWEN35.md 4e; vLLM qwen3_5_mtp.py), for
// drafting speculative tokens. From the model's final-normed hidden state h_i at position i and
// the token x_{i+1} after it:
//   u = fc([norm_e(embed(x_{i+1})) | norm_h(h_i)])        embedding first, both norms (1 + w)
//   g = mtp.layers.0(u) at position i                      a gated full-attention decoder layer
//                                                          with its own KV (an extra layer of kv_)
//   logits(x_{i+2}) = lm_head(mtp.norm(g))                 the model's lm_head
// Further drafts feed mtp.norm(g) back as the hidden state, with the draft as the token.
//
// Positions: the pair (h_i, x_{i+1}) sits at position i (as vLLM places it; RoPE attention
// depends only on distances, so this equals the note's i + 1). So the head's KV at i needs the
// token after i: every pass runs the head over the pairs its tokens complete (each token with
// the hidden state before it) and keeps its slots' last hidden states for the next pass; a
// draft (mtp_forward) starts from them.
#include <cstring>

#include "base/error.h"
#include "model/qwen3.h"

namespace ellm {

const float* Qwen3Model::mtp_saved_hidden(int slot, int64_t position) const {
  const int64_t first = mtp_first_[slot];
  if (position < first || position >= first + mtp_rows_[slot]) return nullptr;
  const int64_t H = config_.hidden_size;
  return mtp_hidden_.get() + (slot * (limits_.speculative_tokens + 1) + position - first) * H;
}

// The head's input rows for act_.mtp_tokens[0, n) with act_.mtp_hidden, and their RoPE angles.
//                                   mtp_in: [n][2 H] = [norm_e(embed(token)) | norm_h(hidden)]
void Qwen3Model::mtp_inputs(int64_t n, float* rope_cos, float* rope_sin) {
  const int64_t H = config_.hidden_size, half = config_.head_dim / 2;
  const float eps = float(config_.rms_norm_eps);
  const MtpWeights& mtp = weights_.mtp;
  profiler_.time(Op::norm, 0, 0, [&] {
    rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float* e = act_.mtp_scratch + i * H;
        bf16* in = act_.mtp_in + i * 2 * H;
        convert_bf16_to_f32(weights_.embedding + int64_t(act_.mtp_tokens[i].token) * H, e, H);
        rmsnorm(e, 1, H, H, mtp.norm_embedding.get(), eps, e, H);
        convert_f32_to_bf16(e, in, H);
        rmsnorm(act_.mtp_hidden[i], 1, H, H, mtp.norm_hidden.get(), eps, e, H);
        convert_f32_to_bf16(e, in + H, H);
        rope_angles(act_.mtp_tokens[i].position, inv_freq_.data(), config_.rotary_dim() / 2,
                    rope_cos + i * half, rope_sin + i * half);
      }
    });
  });
}

// x = fc(mtp_in), then the head's decoder layer over it.                     x: [n][H]
void Qwen3Model::mtp_layer(int64_t n, float* x, float* rope_cos, float* rope_sin) {
  const int64_t H = config_.hidden_size;
  gemm(Op::mtp_fc, act_.mtp_in, n, 2 * H, weights_.mtp.fc, x, H, false);
  layer(config_.num_hidden_layers, {std::span(act_.mtp_tokens).first(size_t(n)), x, rope_cos, rope_sin});
}

// After a pass: the head's KV for the pairs the pass completed, and each slot's last hidden
// states (all rows of a speculative group: accept() keeps those it keeps).
void Qwen3Model::mtp_after_pass(const PassRows& r) {
  const int64_t n = int64_t(r.tokens.size()), H = config_.hidden_size;
  const int64_t capacity = limits_.speculative_tokens + 1;
  const float eps = float(config_.rms_norm_eps);
  // h = norm(x) for every row (lm_head normed only the rows that wanted logits). xn: [n][H]
  rows(n, [&](int64_t begin, int64_t end) {
    rmsnorm(r.x + begin * H, end - begin, H, H, weights_.final_norm.get(), eps, act_.xn + begin * H, H);
  });
  // Token p pairs with the hidden state at p - 1: the row before it, or its slot's last pass's.
  int64_t m = 0;
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& token = r.tokens[t];
    const bool follows = t > 0 && r.tokens[t - 1].slot == token.slot &&
                         r.tokens[t - 1].position == token.position - 1;
    const float* hidden = follows ? act_.xn + (t - 1) * H : mtp_saved_hidden(token.slot, token.position - 1);
    if (!hidden) continue;  // position 0, or a slot whose last hidden state is gone
    act_.mtp_tokens[m] = {token.token, token.slot, token.position - 1, false};
    act_.mtp_hidden[m++] = hidden;
  }
  // The inputs first: they may read the hidden states replaced here.
  mtp_inputs(m, r.rope_cos, r.rope_sin);
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& token = r.tokens[t];
    if (t + 1 < n && r.tokens[t + 1].slot == token.slot) continue;  // not the slot's last row
    int64_t count = 1;  // a group keeps every row, others the last
    while (token.speculative && count < capacity && count <= t && r.tokens[t - count].slot == token.slot)
      ++count;
    std::memcpy(mtp_hidden_.get() + token.slot * capacity * H, act_.xn + (t - count + 1) * H,
                size_t(count * H) * sizeof(float));
    mtp_first_[token.slot] = token.position - count + 1;
    mtp_rows_[token.slot] = count;
    mtp_chain_position_[token.slot] = -1;
  }
  if (m > 0) mtp_layer(m, r.x, r.rope_cos, r.rope_sin);  // the pass is done with its x rows
}

void Qwen3Model::mtp_accept(int slot, int64_t end) {
  mtp_rows_[slot] = std::clamp<int64_t>(end - mtp_first_[slot], 0, mtp_rows_[slot]);
  mtp_chain_position_[slot] = -1;
}

void Qwen3Model::mtp_forward(std::span<const BatchToken> tokens, float* logits) {
  if (!limits_.mtp) fail_no_mtp();
  if (pass_.open) fail("mtp_forward", "a pass is in progress");
  validate(tokens);
  const int64_t n = int64_t(tokens.size()), H = config_.hidden_size, V = config_.vocab_size;
  if (n > limits_.batch_size)
    fail("mtp_forward", std::to_string(n) + " tokens, more than the batch size " +
                            std::to_string(limits_.batch_size));
  for (int64_t i = 0; i < n; ++i) {
    const BatchToken& t = tokens[i];
    for (int64_t j = 0; j < i; ++j)
      if (tokens[j].slot == t.slot) fail("mtp_forward", "slot " + std::to_string(t.slot) + " twice in one draft");
    const float* hidden = mtp_saved_hidden(t.slot, t.position - 1);
    if (!hidden && mtp_chain_position_[t.slot] == t.position - 1 && t.position > 0)
      hidden = mtp_chain_.get() + t.slot * H;
    if (!hidden)
      fail("mtp_forward", "slot " + std::to_string(t.slot) + " has no hidden state at position " +
                              std::to_string(t.position - 1) + " to draft from");
    act_.mtp_tokens[i] = {t.token, t.slot, t.position - 1, false};
    act_.mtp_hidden[i] = hidden;
  }
  for (const BatchToken& t : tokens) {
    kv_.note_written(t.slot, t.position);
    kv_.commit(t.slot, t.position, team_);
  }
  float* x = act_.step_x;
  mtp_inputs(n, act_.step_rope_cos, act_.step_rope_sin);
  mtp_layer(n, x, act_.step_rope_cos, act_.step_rope_sin);
  // The head's output, normed: the next draft's hidden state and the lm_head's input.
  const float eps = float(config_.rms_norm_eps);
  for (int64_t i = 0; i < n; ++i) {
    const int slot = tokens[i].slot;
    rmsnorm(x + i * H, 1, H, H, weights_.mtp.norm.get(), eps, mtp_chain_.get() + slot * H, H);
    convert_f32_to_bf16(mtp_chain_.get() + slot * H, act_.xb + i * H, H);
    mtp_chain_position_[slot] = tokens[i].position;
  }
  gemm(Op::lm_head, act_.xb, n, H, weights_.lm_head, logits, V, false);
}

}  // namespace ellm
