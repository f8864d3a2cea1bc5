// The Qwen3.5 / Qwen3.6 / Qwen3.8 parts of the forward pass (HF modeling_qwen3_5.py,
// ../shared/QWEN35.md section 4): the Gated DeltaNet layer, the gated full attention and the
// MoE block's shared expert. Everything but the inputs of the matrix products is FP32.
#include <cmath>
#include <cstring>

#include "model/qwen3.h"

namespace ellm {
namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // torch's threshold

// Below this many tokens of one slot the recurrence costs less than a chunk (bench_gdn: a token
// of a 128 x 128 head takes 2.3 us, a chunk of 17 tokens 21 us and one of 64 tokens 64 us).
constexpr int64_t kRecurrentRun = 16;

// Where the state after a run's last token is to be copied (BatchToken::snapshot).
uint8_t* captured_after(const PassRows& r, const SlotRun& run) {
  return r.tokens[run.begin + run.count - 1].snapshot;
}

}  // namespace

// Gated attention, per token: q_proj's rows hold [query | gate] per head. q = rope(q_norm(q)),
// k = rope(k_norm(k)) (norms (1 + w), RoPE on the first rotary_dim dims); q into act_.q, k and
// v into the cache.             qkv: [n][n_heads][2 head_dim] | [n_kv_heads][head_dim] x 2
void Qwen3Model::gated_qk_norm_rope_to_cache(int64_t layer, const PassRows& r) {
  const LayerWeights& L = weights_.layers[layer];
  const ModelConfig& c = config_;
  const int64_t hd = c.head_dim, Q = c.q_dim(), KV = c.kv_dim(), W = 2 * Q + 2 * KV;
  const int64_t kv_layer = kv_layer_[layer];
  const float eps = float(c.rms_norm_eps);
  profiler_.time(Op::qk_norm_rope, 0, 0, [&] {
    rows(int64_t(r.tokens.size()), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* query = act_.qkv + t * W;  // head h at h * 2 hd
        float* q = act_.q + t * Q;              // [n_heads][hd]
        float* k = act_.qkv + t * W + 2 * Q;    // [n_kv_heads][hd]
        float* v = k + KV;
        const float* cos = r.rope_cos + t * (hd / 2);
        const float* sin = r.rope_sin + t * (hd / 2);
        rmsnorm(query, c.num_attention_heads, hd, 2 * hd, L.q_norm.get(), eps, q, hd);
        rope_partial(q, c.num_attention_heads, hd, c.rotary_dim(), cos, sin);
        rmsnorm(k, c.num_key_value_heads, hd, hd, L.k_norm.get(), eps, k, hd);
        rope_partial(k, c.num_key_value_heads, hd, c.rotary_dim(), cos, sin);
        const BatchToken& token = r.tokens[t];
        convert_f32_to_f16(k, kv_.k(kv_layer, token.slot) + token.position * KV, KV);
        convert_f32_to_f16(v, kv_.v(kv_layer, token.slot) + token.position * KV, KV);
      }
    });
  });
}

// attn = attn * sigmoid(gate), the gates in the qkv rows beside each head's query.
void Qwen3Model::apply_output_gate(const PassRows& r) {
  const ModelConfig& c = config_;
  const int64_t hd = c.head_dim, Q = c.q_dim(), W = 2 * Q + 2 * c.kv_dim();
  profiler_.time(Op::gate_mul, 0, 0, [&] {
    rows(int64_t(r.tokens.size()), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        for (int64_t h = 0; h < c.num_attention_heads; ++h) {
          const float* gate = act_.qkv + t * W + h * 2 * hd + hd;
          float* o = act_.attn + t * Q + h * hd;
          for (int64_t d = 0; d < hd; ++d) o[d] *= sigmoid(gate[d]);
        }
    });
  });
}

// The runs of consecutive tokens of one slot in act_.runs, each slot's runs chained in order;
// returns how many slots there are (their first runs in act_.first_runs).
int64_t Qwen3Model::find_slot_runs(std::span<const BatchToken> tokens) {
  int64_t n_runs = 0, n_slots = 0;
  for (int64_t t = 0; t < int64_t(tokens.size()); ++t) {
    // A run ends where a state is captured: its chunks of the delta rule end there too.
    if (t > 0 && tokens[t].slot == tokens[t - 1].slot &&
        tokens[t].position == tokens[t - 1].position + 1 && !tokens[t - 1].snapshot) {
      ++act_.runs[n_runs - 1].count;
      continue;
    }
    act_.runs[n_runs] = {tokens[t].slot, int32_t(t), 1, -1};
    int64_t previous = n_runs - 1;
    while (previous >= 0 && act_.runs[previous].slot != tokens[t].slot) --previous;
    if (previous >= 0)
      act_.runs[previous].next = int32_t(n_runs);
    else
      act_.first_runs[n_slots++] = int32_t(n_runs);
    ++n_runs;
  }
  return n_slots;
}

// x = x + out_proj(gated_norm(delta_rule(q, k, v, beta, g), z)), with (HF Qwen3_5GatedDeltaNet)
//   [qkv | z] = xn W_qkvz^T, [b | a] = xn W_ba^T           xn = input_layernorm(x)
//   q | k | v = silu(causal_conv1d(qkv)); q = l2norm(q) / sqrt(dk); k = l2norm(k)
//   beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias)
// v head j reads q/k head j / (Hv / Hk). Each slot's conv window and delta-rule state carry
// the sequence from its earlier passes (and parts) into this one.
void Qwen3Model::gdn_block(int64_t layer, const PassRows& r) {
  const LayerWeights& L = weights_.layers[layer];
  const GdnWeights& G = L.gdn;
  const ModelConfig& c = config_;
  const int64_t n = int64_t(r.tokens.size()), H = c.hidden_size;
  const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t CD = c.conv_dim(), VD = c.linear_value_dim(), P = CD + VD;
  const int64_t taps = c.linear_conv_kernel_dim, state_layer = gdn_layer_[layer];
  const float eps = float(c.rms_norm_eps);

  norm_to_bf16(L.input_norm.get(), r.x, n);
  // qkvz = xb @ [W_qkv; W_z]^T                                  qkvz: [n][CD + VD]
  // ba   = xb @ [W_b; W_a]^T                                    ba:   [n][2 Hv]
  gemm(Op::qkv, act_.xb, n, H, G.qkvz, act_.gdn_qkvz, P, false);
  gemm(Op::qkv, act_.xb, n, H, G.ba, act_.gdn_ba, 2 * Hv, false);
  const int64_t n_slots = find_slot_runs(r.tokens);
  auto each_run = [&](int64_t slot_index, auto&& fn) {
    for (int32_t run = act_.first_runs[slot_index]; run >= 0; run = act_.runs[run].next)
      fn(act_.runs[run]);
  };

  // u = silu(conv1d(qkv)) through each slot's window; the members split the channels, and go
  // through a run kConvRows tokens at a time, so the rows they read stay in cache (a row is
  // tens of KiB apart from the next: column by column over a long prompt would miss the TLB).
  //                                                             u: [n][CD]
  constexpr int64_t kConvRows = 16;
  profiler_.time(Op::gdn_conv, 2.0 * double(n * CD * taps), 0, [&] {
    team_.run([&](int m, int nm) {
      auto [b0, b1] = split_range((CD + 15) / 16, m, nm);  // whole vectors of 16 channels
      const int64_t c0 = b0 * 16, c1 = std::min(CD, b1 * 16);
      if (c0 >= c1) return;
      for (int64_t s = 0; s < n_slots; ++s)
        each_run(s, [&](const SlotRun& run) {
          float* window = state_.conv(state_layer, run.slot);
          for (int64_t t = run.begin; t < run.begin + run.count; t += kConvRows)
            conv1d_silu(act_.gdn_qkvz + t * P + c0, std::min(kConvRows, run.begin + run.count - t), P,
                        window + c0, G.conv.get() + c0, taps, c1 - c0, CD, act_.gdn_u + t * CD + c0, CD);
          if (uint8_t* snapshot = captured_after(r, run))
            for (int64_t row = 0; row < taps - 1; ++row)
              std::memcpy(state_.conv_in(snapshot, state_layer) + row * CD + c0, window + row * CD + c0,
                          size_t(c1 - c0) * sizeof(float));
        });
    });
  });

  profiler_.time(Op::gdn_gates, 0, 0, [&] {
    const float q_scale = 1.0f / std::sqrt(float(dk));
    rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* q = act_.gdn_u + t * CD;  // [Hk][dk]
        float* k = q + Hk * dk;          // [Hk][dk]
        l2norm(q, Hk, dk, dk, q_scale, 1e-6f, q, dk);
        l2norm(k, Hk, dk, dk, 1.0f, 1e-6f, k, dk);
        const float* b = act_.gdn_ba + t * 2 * Hv;
        const float* a = b + Hv;
        for (int64_t h = 0; h < Hv; ++h) {
          act_.gdn_beta[t * Hv + h] = sigmoid(b[h]);
          act_.gdn_g[t * Hv + h] = -std::exp(G.A_log[h]) * softplus(a[h] + G.dt_bias[h]);
        }
      }
    });
  });
  record_speculative(layer, r);  // what a rollback of speculative tokens replays

  // o = delta_rule(...) per (slot, v head), kDeltaChunk tokens at a time: the chunked form, or
  // the recurrence for up to kRecurrentRun tokens. A decode step and a short group of tokens
  // (speculative drafts being checked) then run exactly the same arithmetic, token by token.
  //                                                             o: [n][Hv][dv]
  const size_t scratch_floats = gated_delta_chunk_scratch_floats(dk, dv);
  const double delta_flops = 6.0 * double(n * Hv * dk * dv);
  profiler_.time(Op::gdn_delta, delta_flops, double(n_slots * Hv * dk * dv * 8), [&] {
    team_.run([&](int m, int nm) {
      auto [i0, i1] = split_range(n_slots * Hv, m, nm);
      float* scratch = act_.delta_scratch + size_t(m) * scratch_floats;
      for (int64_t item = i0; item < i1; ++item) {
        const int64_t j = item % Hv, i = j / (Hv / Hk);
        each_run(item / Hv, [&](const SlotRun& run) {
          float* S = state_.S(state_layer, run.slot) + j * dk * dv;  // [dk][dv]
          for (int64_t c0 = 0; c0 < run.count; c0 += kDeltaChunk) {
            const int64_t t0 = run.begin + c0, len = std::min(kDeltaChunk, run.count - c0);
            const float* u = act_.gdn_u + t0 * CD;
            const float *q = u + i * dk, *k = u + Hk * dk + i * dk, *v = u + 2 * Hk * dk + j * dv;
            const float* g = act_.gdn_g + t0 * Hv + j;
            const float* beta = act_.gdn_beta + t0 * Hv + j;
            float* o = act_.gdn_o + t0 * VD + j * dv;
            if (len <= kRecurrentRun)
              for (int64_t t = 0; t < len; ++t)
                gated_delta_step(S, dk, dv, q + t * CD, k + t * CD, v + t * CD, std::exp(g[t * Hv]),
                                 beta[t * Hv], o + t * VD);
            else
              gated_delta_chunk(S, dk, dv, q, k, CD, v, CD, g, beta, Hv, len, o, VD, scratch);
          }
          if (uint8_t* snapshot = captured_after(r, run))
            std::memcpy(state_.S_in(snapshot, state_layer) + j * dk * dv, S, size_t(dk * dv) * sizeof(float));
        });
      }
    });
  });

  // y = norm(o) * silu(z) per v head (the norm's weight as stored); x = x + y @ W_out^T
  profiler_.time(Op::gdn_norm, 0, 0, [&] {
    rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        gated_rmsnorm(act_.gdn_o + t * VD, act_.gdn_qkvz + t * P + CD, Hv, dv, dv, dv,
                      G.norm.get(), eps, act_.gdn_o + t * VD, dv);
      convert_f32_to_bf16(act_.gdn_o + begin * VD, act_.xb + begin * VD, (end - begin) * VD);
    });
  });
  gemm(Op::o_proj, act_.xb, n, VD, G.out_proj, r.x, H, true);
}

// x = x + sigmoid(xn . w_gate) * down(silu(gate(xb)) * up(xb)), beside the routed experts;
// xn, xb = post_attention_layernorm(x) as moe_block left them.
void Qwen3Model::shared_expert(const MoeWeights& moe, float* x, int64_t n) {
  const int64_t H = config_.hidden_size, FS = moe.shared.down.k;
  gemm(Op::gate_up, act_.xb, n, H, moe.shared.gate_up, act_.shared_gate_up, 2 * FS, false);
  profiler_.time(Op::silu_mul, 0, 0, [&] {
    rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* gate_up = act_.shared_gate_up + t * 2 * FS;
        silu_mul(gate_up, gate_up + FS, gate_up, FS);
        convert_f32_to_bf16(gate_up, act_.xb + t * FS, FS);
      }
    });
  });
  gemm(Op::down, act_.xb, n, FS, moe.shared.down, act_.shared_out, H, false);
  profiler_.time(Op::moe_combine, 0, 0, [&] {
    rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* xn = act_.xn + t * H;
        float logit;
        dot_rows_f32(xn, 1, H, moe.shared_gate.get(), 1, H, &logit, 1);
        const float scale = sigmoid(logit);
        for (int64_t i = 0; i < H; ++i) x[t * H + i] += scale * act_.shared_out[t * H + i];
      }
    });
  });
}

}  // namespace ellm
