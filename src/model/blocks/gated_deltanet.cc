#include "model/blocks/gated_deltanet.h"

#include <cmath>
#include <cstring>

#include "model/blocks/activation.h"

namespace ellm {
namespace {

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // torch's threshold

// o = weight * o / rms(o) * sigmoid(z) per head of dv values, in place (FP32, the same code on
// every tier).                                             o, z: [heads][dv]
void sigmoid_gated_rmsnorm(float* o, const float* z, int64_t heads, int64_t dv, const float* weight,
                           float eps) {
  for (int64_t h = 0; h < heads; ++h) {
    float* x = o + h * dv;
    double sum_sq = 0;
    for (int64_t i = 0; i < dv; ++i) sum_sq += double(x[i]) * x[i];
    const float inv_rms = 1.0f / std::sqrt(float(sum_sq / double(dv)) + eps);
    for (int64_t i = 0; i < dv; ++i) x[i] = weight[i] * (x[i] * inv_rms) * sigmoid(z[h * dv + i]);
  }
}

// Where the state after a run's last token is to be copied (BatchToken::snapshot).
uint8_t* snapshot_after(const PassRows& r, const SlotRun& run) {
  return r.tokens[run.begin + run.count - 1].snapshot;
}

// The runs of consecutive tokens of one slot in b.runs, each slot's runs chained in order;
// returns how many slots there are (their first runs in b.first_runs).
int64_t find_slot_runs(std::span<const BatchToken> tokens, GatedDeltaNetBuffers& b) {
  int64_t n_runs = 0, n_slots = 0;
  for (int64_t t = 0; t < int64_t(tokens.size()); ++t) {
    // A run ends where a snapshot is taken: its chunks of the delta rule end there too.
    if (t > 0 && tokens[t].slot == tokens[t - 1].slot &&
        tokens[t].position == tokens[t - 1].position + 1 && !tokens[t - 1].snapshot) {
      ++b.runs[n_runs - 1].count;
      continue;
    }
    b.runs[n_runs] = {tokens[t].slot, int32_t(t), 1, -1};
    int64_t previous = n_runs - 1;
    while (previous >= 0 && b.runs[previous].slot != tokens[t].slot) --previous;
    if (previous >= 0)
      b.runs[previous].next = int32_t(n_runs);
    else
      b.first_runs[n_slots++] = int32_t(n_runs);
    ++n_runs;
  }
  return n_slots;
}

// What the layer took in for each speculative token of the rows (between its gates and its
// delta rule): the conv input (in_proj_qkv row), q | k | v, g and beta, for a rollback to replay.
void record_speculative(const GatedDeltaNetSpec& s, const SequenceMemory& memory, int64_t state_layer,
                        const PassRows& r, const GatedDeltaNetBuffers& b) {
  const StateRollback& rollback = memory.rollback();
  if (rollback.empty()) return;
  const int64_t CD = s.conv_dim(), P = CD + s.value_dim(), Hv = s.value_heads;
  for (int64_t t = 0; t < r.size(); ++t) {
    const BatchToken& token = r.tokens[t];
    if (!token.speculative) continue;
    const int64_t index = memory.group_index(token.slot, token.position);
    std::memcpy(rollback.conv_input(state_layer, token.slot, index), b.qkvz + t * P,
                size_t(CD) * sizeof(float));
    std::memcpy(rollback.delta_qkv(state_layer, token.slot, index), b.u + t * CD,
                size_t(CD) * sizeof(float));
    std::memcpy(rollback.log_decay(state_layer, token.slot, index), b.g + t * Hv,
                size_t(Hv) * sizeof(float));
    std::memcpy(rollback.beta(state_layer, token.slot, index), b.beta + t * Hv,
                size_t(Hv) * sizeof(float));
  }
}

}  // namespace

GatedDeltaNetWeights load_gated_deltanet(TensorLoader& load, const std::string& a,
                                         const GatedDeltaNetSpec& s) {
  const int64_t H = s.hidden, CD = s.conv_dim(), Hv = s.value_heads, VD = s.value_dim();
  GatedDeltaNetWeights w;
  w.qkvz = load.packed({a + "in_proj_qkv.weight", a + "in_proj_z.weight"}, {CD, VD}, H);
  // Qwen's FP8 checkpoints keep the small b and a projections BF16; so does quantising.
  w.ba = load.packed({a + "in_proj_b.weight", a + "in_proj_a.weight"}, {Hv, Hv}, H,
                     /*quantizable=*/false);
  w.conv = load.conv_weight(a + "conv1d.weight", CD, s.conv_taps);
  w.A_log = load.vector_f32(a + "A_log", Hv);
  w.dt_bias = load.vector_f32(a + "dt_bias", Hv);
  w.norm = load.vector_f32(a + "norm.weight", s.dv);
  w.out_proj = load.packed({a + "out_proj.weight"}, {H}, VD);
  return w;
}

void plan_gated_deltanet(ActivationPlan& plan, GatedDeltaNetBuffers& b, const GatedDeltaNetSpec& s,
                         size_t T, int members) {
  const size_t CD = size_t(s.conv_dim()), VD = size_t(s.value_dim()), HV = size_t(s.value_heads);
  plan.carve(b.qkvz, T * (CD + VD));
  plan.carve(b.ba, T * 2 * HV);
  plan.carve(b.u, T * CD);
  plan.carve(b.g, T * HV);
  plan.carve(b.beta, T * HV);
  plan.carve(b.o, T * VD);
  plan.carve(b.delta_scratch, size_t(members) * gated_delta_chunk_scratch_floats(s.dk, s.dv));
  b.runs.resize(T);
  b.first_runs.resize(T);
}

void gated_deltanet(BlockContext& ctx, const GatedDeltaNetSpec& s, const GatedDeltaNetWeights& w,
                    SequenceMemory& memory, int64_t state_layer, const PassRows& r, bf16* xb,
                    GatedDeltaNetBuffers& b) {
  RecurrentState& state = memory.state();
  const int64_t n = r.size(), H = s.hidden;
  const int64_t Hk = s.key_heads, Hv = s.value_heads, dk = s.dk, dv = s.dv;
  const int64_t CD = s.conv_dim(), VD = s.value_dim(), P = CD + VD, taps = s.conv_taps;

  // qkvz = xb @ [W_qkv; W_z]^T                                  qkvz: [n][CD + VD]
  // ba   = xb @ [W_b; W_a]^T                                    ba:   [n][2 Hv]
  ctx.gemm(Op::qkv, xb, n, H, w.qkvz, b.qkvz, P, false);
  ctx.gemm(Op::qkv, xb, n, H, w.ba, b.ba, 2 * Hv, false);
  const int64_t n_slots = find_slot_runs(r.tokens, b);
  auto each_run = [&](int64_t slot_index, auto&& fn) {
    for (int32_t run = b.first_runs[slot_index]; run >= 0; run = b.runs[run].next) fn(b.runs[run]);
  };

  // u = silu(conv1d(qkv)) through each slot's window; the members split the channels, and go
  // through a run kConvRows tokens at a time, so the rows they read stay in cache (a row is
  // tens of KiB apart from the next: column by column over a long prompt would miss the TLB).
  //                                                             u: [n][CD]
  constexpr int64_t kConvRows = 16;
  ctx.profiler.time(Op::gdn_conv, 2.0 * double(n * CD * taps), 0, [&] {
    ctx.team.run([&](int m, int nm) {
      auto [b0, b1] = split_range((CD + 15) / 16, m, nm);  // whole vectors of 16 channels
      const int64_t c0 = b0 * 16, c1 = std::min(CD, b1 * 16);
      if (c0 >= c1) return;
      for (int64_t i = 0; i < n_slots; ++i)
        each_run(i, [&](const SlotRun& run) {
          float* window = state.conv(state_layer, run.slot);
          for (int64_t t = run.begin; t < run.begin + run.count; t += kConvRows)
            conv1d_silu(b.qkvz + t * P + c0, std::min(kConvRows, run.begin + run.count - t), P,
                        window + c0, w.conv.get() + c0, taps, c1 - c0, CD, b.u + t * CD + c0, CD);
          if (uint8_t* snapshot = snapshot_after(r, run))
            for (int64_t row = 0; row < taps - 1; ++row)
              std::memcpy(state.conv_in(snapshot, state_layer) + row * CD + c0, window + row * CD + c0,
                          size_t(c1 - c0) * sizeof(float));
        });
    });
  });

  ctx.profiler.time(Op::gdn_gates, 0, 0, [&] {
    const float q_scale = 1.0f / std::sqrt(float(dk));
    ctx.rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* q = b.u + t * CD;  // [Hk][dk]
        float* k = q + Hk * dk;   // [Hk][dk]
        l2norm(q, Hk, dk, dk, q_scale, 1e-6f, q, dk);
        l2norm(k, Hk, dk, dk, 1.0f, 1e-6f, k, dk);
        const float* bb = b.ba + t * 2 * Hv;
        const float* a = bb + Hv;
        for (int64_t h = 0; h < Hv; ++h) {
          b.beta[t * Hv + h] = sigmoid(bb[h]);
          b.g[t * Hv + h] = -std::exp(w.A_log[h]) * softplus(a[h] + w.dt_bias[h]);
        }
      }
    });
  });
  record_speculative(s, memory, state_layer, r, b);

  // o = delta_rule(...) per (slot, v head), kDeltaChunk tokens at a time: the chunked form, or
  // the recurrence for up to kRecurrentRun tokens. A decode step and a short group of tokens
  // (speculative drafts being checked) then run exactly the same arithmetic, token by token.
  //                                                             o: [n][Hv][dv]
  const size_t scratch_floats = gated_delta_chunk_scratch_floats(dk, dv);
  const double delta_flops = 6.0 * double(n * Hv * dk * dv);
  ctx.profiler.time(Op::gdn_delta, delta_flops, double(n_slots * Hv * dk * dv * 8), [&] {
    ctx.team.run([&](int m, int nm) {
      auto [i0, i1] = split_range(n_slots * Hv, m, nm);
      float* scratch = b.delta_scratch + size_t(m) * scratch_floats;
      for (int64_t item = i0; item < i1; ++item) {
        const int64_t j = item % Hv, i = j / (Hv / Hk);
        each_run(item / Hv, [&](const SlotRun& run) {
          float* S = state.S(state_layer, run.slot) + j * dk * dv;  // [dk][dv]
          for (int64_t c0 = 0; c0 < run.count; c0 += kDeltaChunk) {
            const int64_t t0 = run.begin + c0, len = std::min(kDeltaChunk, run.count - c0);
            const float* u = b.u + t0 * CD;
            const float *q = u + i * dk, *k = u + Hk * dk + i * dk, *v = u + 2 * Hk * dk + j * dv;
            const float* g = b.g + t0 * Hv + j;
            const float* beta = b.beta + t0 * Hv + j;
            float* o = b.o + t0 * VD + j * dv;
            if (len <= kRecurrentRun)
              for (int64_t t = 0; t < len; ++t)
                gated_delta_step(S, dk, dv, q + t * CD, k + t * CD, v + t * CD, std::exp(g[t * Hv]),
                                 beta[t * Hv], o + t * VD);
            else
              gated_delta_chunk(S, dk, dv, q, k, CD, v, CD, g, beta, Hv, len, o, VD, scratch);
          }
          if (uint8_t* snapshot = snapshot_after(r, run))
            std::memcpy(state.S_in(snapshot, state_layer) + j * dk * dv, S, size_t(dk * dv) * sizeof(float));
        });
      }
    });
  });

  // y = norm(o) * silu(z) per v head (the norm's weight as stored; sigmoid(z) with
  // sigmoid_gate); x = x + y @ W_out^T
  ctx.profiler.time(Op::gdn_norm, 0, 0, [&] {
    ctx.rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        if (s.sigmoid_gate)
          sigmoid_gated_rmsnorm(b.o + t * VD, b.qkvz + t * P + CD, Hv, dv, w.norm.get(), s.eps);
        else
          gated_rmsnorm(b.o + t * VD, b.qkvz + t * P + CD, Hv, dv, dv, dv, w.norm.get(), s.eps,
                        b.o + t * VD, dv);
      convert_f32_to_bf16(b.o + begin * VD, xb + begin * VD, (end - begin) * VD);
    });
  });
  ctx.gemm(Op::o_proj, xb, n, VD, w.out_proj, r.x, H, true);
}

}  // namespace ellm
