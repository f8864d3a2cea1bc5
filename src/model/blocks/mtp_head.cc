#include "model/blocks/mtp_head.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/error.h"

namespace ellm {

MtpWeights load_mtp(TensorLoader& load, int64_t H, NormReader norm) {
  MtpWeights w;
  w.fc = load.packed({"mtp.fc.weight"}, {H}, 2 * H, /*quantizable=*/false);
  w.norm_embedding = (load.*norm)("mtp.pre_fc_norm_embedding.weight", H);
  w.norm_hidden = (load.*norm)("mtp.pre_fc_norm_hidden.weight", H);
  w.norm = (load.*norm)("mtp.norm.weight", H);
  return w;
}

void MtpHead::init(const MtpSpec& spec, int64_t batch, int64_t max_group) {
  spec_ = spec;
  capacity_ = max_group;
  const size_t B = size_t(batch), H = size_t(spec.hidden);
  hidden_ = make_buffer<float>(B * size_t(max_group) * H);
  chain_ = make_buffer<float>(B * H);
  first_.assign(B, -1);
  rows_.assign(B, 0);
  chain_position_.assign(B, -1);
}

void MtpHead::plan(ActivationPlan& plan, size_t T) {
  plan.carve(in_, T * 2 * size_t(spec_.hidden));
  plan.carve(scratch_, T * size_t(spec_.hidden));
  tokens_.resize(T);
  pair_hidden_.resize(T);
}

const float* MtpHead::saved_hidden(int slot, int64_t position) const {
  const int64_t first = first_[slot];
  if (position < first || position >= first + rows_[slot]) return nullptr;
  return hidden_.get() + (slot * capacity_ + position - first) * spec_.hidden;
}

// The head's input rows for tokens_[0, n) with pair_hidden_, and their RoPE angles.
//                                     in: [n][2 H] = [norm_e(embed(token)) | norm_h(hidden)]
void MtpHead::inputs_for(BlockContext& ctx, const MtpWeights& w, int64_t n, float* rope_cos,
                         float* rope_sin) {
  const int64_t H = spec_.hidden, half = spec_.angle_stride;
  const float eps = spec_.eps;
  ctx.profiler.time(Op::norm, 0, 0, [&] {
    ctx.rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float* e = scratch_ + i * H;
        bf16* in = in_ + i * 2 * H;
        convert_bf16_to_f32(spec_.embedding + int64_t(tokens_[i].token) * H, e, H);
        rmsnorm(e, 1, H, H, w.norm_embedding.get(), eps, e, H);
        convert_f32_to_bf16(e, in, H);
        rmsnorm(pair_hidden_[i], 1, H, H, w.norm_hidden.get(), eps, e, H);
        convert_f32_to_bf16(e, in + H, H);
        token_rope_angles(tokens_[i], *spec_.rope, rope_cos + i * half, rope_sin + i * half);
      }
    });
  });
}

int64_t MtpHead::after_pass(BlockContext& ctx, const MtpWeights& w, const float* final_norm,
                            const PassRows& r, float* xn) {
  const int64_t n = r.size(), H = spec_.hidden;
  // h = norm(x) for every row (lm_head normed only the rows that wanted logits). xn: [n][H]
  ctx.rows(n, [&](int64_t begin, int64_t end) {
    rmsnorm(r.x + begin * H, end - begin, H, H, final_norm, spec_.eps, xn + begin * H, H);
  });
  // Token p pairs with the hidden state at p - 1: the row before it, or its slot's last pass's.
  int64_t m = 0;
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& token = r.tokens[t];
    const bool follows = t > 0 && r.tokens[t - 1].slot == token.slot &&
                         r.tokens[t - 1].position == token.position - 1;
    const float* hidden = follows ? xn + (t - 1) * H : saved_hidden(token.slot, token.position - 1);
    if (!hidden) continue;  // position 0, or a slot whose last hidden state is gone
    tokens_[m] = {token.token, token.slot, token.position - 1, false};
    pair_hidden_[m++] = hidden;
  }
  // The inputs first: they may read the hidden states replaced here.
  inputs_for(ctx, w, m, r.rope_cos, r.rope_sin);
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& token = r.tokens[t];
    if (t + 1 < n && r.tokens[t + 1].slot == token.slot) continue;  // not the slot's last row
    int64_t count = 1;  // a group keeps every row, others the last
    while (token.speculative && count < capacity_ && count <= t && r.tokens[t - count].slot == token.slot)
      ++count;
    std::memcpy(hidden_.get() + token.slot * capacity_ * H, xn + (t - count + 1) * H,
                size_t(count * H) * sizeof(float));
    first_[token.slot] = token.position - count + 1;
    rows_[token.slot] = count;
    chain_position_[token.slot] = -1;
  }
  return m;
}

void MtpHead::draft_inputs(BlockContext& ctx, const MtpWeights& w, std::span<const BatchToken> tokens,
                           float* rope_cos, float* rope_sin) {
  const int64_t n = int64_t(tokens.size()), H = spec_.hidden;
  for (int64_t i = 0; i < n; ++i) {
    const BatchToken& t = tokens[i];
    for (int64_t j = 0; j < i; ++j)
      if (tokens[j].slot == t.slot) fail("mtp_forward", "slot " + std::to_string(t.slot) + " twice in one draft");
    const float* hidden = saved_hidden(t.slot, t.position - 1);
    if (!hidden && chain_position_[t.slot] == t.position - 1 && t.position > 0)
      hidden = chain_.get() + t.slot * H;
    if (!hidden)
      fail("mtp_forward", "slot " + std::to_string(t.slot) + " has no hidden state at position " +
                              std::to_string(t.position - 1) + " to draft from");
    tokens_[i] = {t.token, t.slot, t.position - 1, false};
    pair_hidden_[i] = hidden;
  }
  inputs_for(ctx, w, n, rope_cos, rope_sin);
}

void MtpHead::draft_outputs(const MtpWeights& w, std::span<const BatchToken> tokens, const float* x,
                            bf16* xb) {
  const int64_t H = spec_.hidden;
  for (int64_t i = 0; i < int64_t(tokens.size()); ++i) {
    const int slot = tokens[i].slot;
    rmsnorm(x + i * H, 1, H, H, w.norm.get(), spec_.eps, chain_.get() + slot * H, H);
    convert_f32_to_bf16(chain_.get() + slot * H, xb + i * H, H);
    chain_position_[slot] = tokens[i].position;
  }
}

void MtpHead::rewritten(int slot) {
  rows_[slot] = 0;
  chain_position_[slot] = -1;
}

void MtpHead::released(int slot, int64_t from_position) {
  if (from_position < first_[slot] + rows_[slot]) rows_[slot] = 0;
  if (from_position <= chain_position_[slot]) chain_position_[slot] = -1;
}

void MtpHead::accepted(int slot, int64_t end) {
  rows_[slot] = std::clamp<int64_t>(end - first_[slot], 0, rows_[slot]);
  chain_position_[slot] = -1;
}

}  // namespace ellm
