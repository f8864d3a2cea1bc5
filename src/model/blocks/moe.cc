#include "model/blocks/moe.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "model/blocks/activation.h"

namespace ellm {
namespace {

// The k largest of p[0, n) (ties: lower index first), best first.
void top_k(const float* p, int64_t n, int64_t k, int32_t* ids, float* values) {
  for (int64_t j = 0; j < k; ++j) {
    ids[j] = -1;
    values[j] = -INFINITY;
  }
  for (int64_t e = 0; e < n; ++e) {
    if (p[e] <= values[k - 1]) continue;
    int64_t j = k - 1;
    while (j > 0 && p[e] > values[j - 1]) {
      ids[j] = ids[j - 1];
      values[j] = values[j - 1];
      --j;
    }
    ids[j] = int32_t(e);
    values[j] = p[e];
  }
}

}  // namespace

MoeWeights load_moe(TensorLoader& load, const std::string& p, const MoeSpec& s, int64_t l,
                    size_t& expert_bytes) {
  const SafetensorsStore& store = load.store();
  const int64_t H = s.hidden, E = s.experts, F = s.ffn;
  if (store.find(p + "experts." + std::to_string(E) + ".gate_proj.weight"))
    fail(store.file_for(p + "gate.weight"),
         "layer " + std::to_string(l) + " has more experts than num_experts = " +
             std::to_string(E) + " in config.json");
  MoeWeights w;
  w.router = load.matrix_f32(p + "gate.weight", E, H);
  const bool fused = store.find(p + "experts.gate_up_proj") != nullptr;
  if (fused && store.get(p + "experts.gate_up_proj").dtype == Dtype::f8_e4m3)
    fail(store.file_for(p + "experts.gate_up_proj"),
         "'" + p + "experts.gate_up_proj' is F8_E4M3: FP8 experts are read one tensor each "
         "(experts.N.gate_proj.weight ...), as Qwen's FP8 checkpoints store them, not fused");
  for (int64_t e = 0; e < E; ++e) {
    SwiGluWeights& expert = w.experts.emplace_back();
    if (fused) {  // gate_up_proj [E][2F][H], gate rows first; down_proj [E][H][F]
      expert.gate_up = load.packed_slice(p + "experts.gate_up_proj", E, 2 * F, H, e);
      expert.down = load.packed_slice(p + "experts.down_proj", E, H, F, e);
    } else {
      expert = load_swiglu(load, p + "experts." + std::to_string(e) + ".", H, F);
    }
    expert_bytes += expert.gate_up.bytes + expert.down.bytes;
  }
  return w;
}

SharedExpertWeights load_shared_expert(TensorLoader& load, const std::string& p, int64_t H, int64_t F) {
  SharedExpertWeights w;
  w.mlp = load_swiglu(load, p + "shared_expert.", H, F);
  w.gate = load.matrix_f32(p + "shared_expert_gate.weight", 1, H);
  return w;
}

void plan_moe(ActivationPlan& plan, MoeBuffers& b, const MoeSpec& s, size_t max_tokens) {
  const size_t T = std::min(max_tokens, size_t(kMoeTileTokens));
  const size_t E = size_t(s.experts), K = size_t(s.top_k), H = size_t(s.hidden), F = size_t(s.ffn);
  plan.carve(b.router_logits, T * E);
  plan.carve(b.topk_expert, T * K);
  plan.carve(b.topk_weight, T * K);
  plan.carve(b.row_of_choice, T * K);
  plan.carve(b.token_of_row, T * K);
  plan.carve(b.in, T * K * H);
  plan.carve(b.gate_up, T * K * 2 * F);
  plan.carve(b.act, T * K * F);
  plan.carve(b.out, T * K * H);
  b.expert_rows.resize(E + 1);
}

void plan_shared_expert(ActivationPlan& plan, SharedExpertBuffers& b, size_t T, size_t H, size_t F) {
  plan_swiglu(plan, b.mlp, T, F);
  plan.carve(b.out, T * H);
}

namespace {

// The experts over one tile of n <= kMoeTileTokens rows.
void moe_tile(BlockContext& ctx, const MoeSpec& s, const MoeWeights& w, const NormedRows& normed,
              int64_t n, MoeBuffers& b, float* x_rows) {
  const int64_t H = s.hidden, E = s.experts, K = s.top_k, F = s.ffn;

  // Routing per token, all in FP32.
  auto route = [&] {
    // router_logits = xn @ Wrouter^T                                 router_logits: [n][E]
    ctx.dot_rows(normed.xn, n, H, w.router.get(), E, H, b.router_logits, E);
    ctx.rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* p = b.router_logits + t * E;  // then the softmax over all experts
        float max_logit = -INFINITY;
        for (int64_t e = 0; e < E; ++e) max_logit = std::max(max_logit, p[e]);
        float sum = 0;
        for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(p[e] - max_logit);
        for (int64_t e = 0; e < E; ++e) p[e] /= sum;
        int32_t* ids = b.topk_expert + t * K;
        float* weights = b.topk_weight + t * K;
        top_k(p, E, K, ids, weights);
        if (s.norm_topk_prob) {
          float total = 0;
          for (int64_t j = 0; j < K; ++j) total += weights[j];
          for (int64_t j = 0; j < K; ++j) weights[j] /= total;
        }
      }
    });
  };
  ctx.profiler.time(Op::moe_router, 2.0 * double(n * E * H), double(E * H * 4), route);

  // Group the n*K choices by expert (a counting sort; tiny, so on this thread).
  std::vector<int64_t>& first_row = b.expert_rows;  // [E + 1]
  std::fill(first_row.begin(), first_row.end(), 0);
  for (int64_t i = 0; i < n * K; ++i) ++first_row[b.topk_expert[i] + 1];
  for (int64_t e = 0; e < E; ++e) first_row[e + 1] += first_row[e];
  for (int64_t i = 0; i < n * K; ++i) {
    int64_t row = first_row[b.topk_expert[i]]++;  // temporarily the next free row
    b.row_of_choice[i] = int32_t(row);
    b.token_of_row[row] = int32_t(i / K);
  }
  for (int64_t e = E; e > 0; --e) first_row[e] = first_row[e - 1];
  first_row[0] = 0;
  uint64_t bytes_read = 0;
  for (int64_t e = 0; e < E; ++e)
    if (first_row[e + 1] > first_row[e])
      bytes_read += w.experts[e].gate_up.bytes + w.experts[e].down.bytes;
  ctx.expert_bytes_read.fetch_add(bytes_read, std::memory_order_relaxed);

  // Gather: in[row] = xb[token of row]                                  in: [n K][H]
  const int64_t n_rows = n * K;
  ctx.rows(n_rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      std::copy_n(normed.xb + int64_t(b.token_of_row[r]) * H, H, b.in + r * H);
  });

  // Every member takes its share of every selected expert's output columns, so the work of
  // a pass splits evenly however the tokens are spread across experts.
  auto each_expert = [&](auto&& fn) {
    ctx.team.run([&](int m, int nm) {
      for (int64_t e = 0; e < E; ++e) {
        int64_t begin = first_row[e], count = first_row[e + 1] - begin;
        if (count > 0) fn(w.experts[e], begin, count, m, nm);
      }
    });
  };
  auto experts = [&] {
    // gate_up = in @ [Wgate; Wup]^T per expert                      gate_up: [n K][2 F]
    each_expert([&](const SwiGluWeights& e, int64_t begin, int64_t count, int m, int nm) {
      matmul(b.in + begin * H, count, H, e.gate_up, b.gate_up + begin * 2 * F, 2 * F, false, m, nm);
    });
    ctx.rows(n_rows, [&](int64_t begin, int64_t end) { silu_mul_to_bf16(b.gate_up, begin, end, F, b.act); });
    // out = act @ Wdown^T per expert                                    out: [n K][H]
    each_expert([&](const SwiGluWeights& e, int64_t begin, int64_t count, int m, int nm) {
      matmul(b.act + begin * F, count, F, e.down, b.out + begin * H, H, false, m, nm);
    });
  };
  ctx.profiler.time(Op::moe_experts, 2.0 * double(n_rows) * double(3 * F * H), double(bytes_read),
                    experts);

  // x[t] += sum_j weight_j * out[row of choice j], in a fixed order per token.
  ctx.profiler.time(Op::moe_combine, 0, 0, [&] {
    ctx.rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* x = x_rows + t * H;
        for (int64_t j = 0; j < K; ++j) {
          const float* out = b.out + int64_t(b.row_of_choice[t * K + j]) * H;
          float weight = b.topk_weight[t * K + j];
          for (int64_t i = 0; i < H; ++i) x[i] += weight * out[i];
        }
      }
    });
  });
}

}  // namespace

void moe(BlockContext& ctx, const MoeSpec& s, const MoeWeights& w, const NormedRows& normed,
         int64_t n, MoeBuffers& b, float* x) {
  const int64_t H = s.hidden;
  for (int64_t t = 0; t < n; t += kMoeTileTokens)
    moe_tile(ctx, s, w, {normed.xn + t * H, normed.xb + t * H}, std::min(kMoeTileTokens, n - t), b, x + t * H);
}

void shared_expert(BlockContext& ctx, const SharedExpertWeights& w, const NormedRows& normed,
                   int64_t n, int64_t H, SharedExpertBuffers& b, float* x) {
  swiglu(ctx, w.mlp, normed.xb, n, H, b.mlp, b.out, /*accumulate=*/false);
  ctx.profiler.time(Op::moe_combine, 0, 0, [&] {
    ctx.rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float logit;
        dot_rows_f32(normed.xn + t * H, 1, H, w.gate.get(), 1, H, &logit, 1);
        const float scale = sigmoid(logit);
        for (int64_t i = 0; i < H; ++i) x[t * H + i] += scale * b.out[t * H + i];
      }
    });
  });
}

}  // namespace ellm
