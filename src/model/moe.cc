// The Qwen3-MoE sparse block (HF Qwen3MoeSparseMoeBlock):
//   router_logits = xn @ Wgate^T; p = softmax(router_logits) in FP32; top-k of p,
//   renormalised when norm_topk_prob; x += sum_k p_k * expert_k(xn).
// Tokens are regrouped by expert so that each selected expert's weights are read once per pass,
// for all of its tokens; experts nobody chose are never touched.
#include <cmath>

#include "model/qwen3.h"

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

void Qwen3Model::moe_block(const MoeWeights& moe, float* x_rows, int64_t n) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, E = c.num_experts, K = c.num_experts_per_tok;
  const int64_t F = c.moe_intermediate_size;
  Activations& a = act_;

  // Routing per token, all in FP32.
  auto route = [&] {
    rows(n, [&](int64_t begin, int64_t end) {
      // router_logits = xn @ Wrouter^T                               router_logits: [n][E]
      dot_rows_f32(a.xn + begin * H, end - begin, H, moe.router.get(), E, H, a.router_logits + begin * E, E);
      for (int64_t t = begin; t < end; ++t) {
        float* p = a.router_logits + t * E;  // then the softmax over all experts
        float max_logit = -INFINITY;
        for (int64_t e = 0; e < E; ++e) max_logit = std::max(max_logit, p[e]);
        float sum = 0;
        for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(p[e] - max_logit);
        for (int64_t e = 0; e < E; ++e) p[e] /= sum;
        int32_t* ids = a.topk_expert + t * K;
        float* weights = a.topk_weight + t * K;
        top_k(p, E, K, ids, weights);
        if (c.norm_topk_prob) {
          float total = 0;
          for (int64_t j = 0; j < K; ++j) total += weights[j];
          for (int64_t j = 0; j < K; ++j) weights[j] /= total;
        }
      }
    });
  };
  profiler_.time(Op::moe_router, 2.0 * double(n * E * H), double(E * H * 4), route);

  // Group the n*K choices by expert (a counting sort; tiny, so on this thread).
  std::vector<int64_t>& first_row = a.expert_rows;  // [E + 1]
  std::fill(first_row.begin(), first_row.end(), 0);
  for (int64_t i = 0; i < n * K; ++i) ++first_row[a.topk_expert[i] + 1];
  for (int64_t e = 0; e < E; ++e) first_row[e + 1] += first_row[e];
  for (int64_t i = 0; i < n * K; ++i) {
    int64_t row = first_row[a.topk_expert[i]]++;  // temporarily the next free row
    a.row_of_choice[i] = int32_t(row);
    a.token_of_row[row] = int32_t(i / K);
  }
  for (int64_t e = E; e > 0; --e) first_row[e] = first_row[e - 1];
  first_row[0] = 0;
  uint64_t bytes_read = 0;
  for (int64_t e = 0; e < E; ++e)
    if (first_row[e + 1] > first_row[e])
      bytes_read += moe.experts[e].gate_up.bytes + moe.experts[e].down.bytes;
  expert_bytes_read_.fetch_add(bytes_read, std::memory_order_relaxed);

  // Gather: moe_in[row] = xb[token of row]                         moe_in: [n K][H]
  const int64_t n_rows = n * K;
  rows(n_rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      std::copy_n(a.xb + int64_t(a.token_of_row[r]) * H, H, a.moe_in + r * H);
  });

  // Every member takes its share of every selected expert's output columns, so the work of
  // a pass splits evenly however the tokens are spread across experts.
  auto each_expert = [&](auto&& fn) {
    team_.run([&](int m, int nm) {
      for (int64_t e = 0; e < E; ++e) {
        int64_t begin = first_row[e], count = first_row[e + 1] - begin;
        if (count > 0) fn(moe.experts[e], begin, count, m, nm);
      }
    });
  };
  auto experts = [&] {
    // gate_up = moe_in @ [Wgate; Wup]^T per expert                  gate_up: [n K][2 F]
    each_expert([&](const SwiGluWeights& w, int64_t begin, int64_t count, int m, int nm) {
      matmul(a.moe_in + begin * H, count, H, w.gate_up, a.moe_gate_up + begin * 2 * F, 2 * F, false,
             m, nm);
    });
    rows(n_rows, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        silu_mul(a.moe_gate_up + r * 2 * F, a.moe_gate_up + r * 2 * F + F, a.moe_act + r * F, F);
      convert_f32_to_bf16(a.moe_act + begin * F, a.moe_act_b + begin * F, (end - begin) * F);
    });
    // out = act @ Wdown^T per expert                                out: [n K][H]
    each_expert([&](const SwiGluWeights& w, int64_t begin, int64_t count, int m, int nm) {
      matmul(a.moe_act_b + begin * F, count, F, w.down, a.moe_out + begin * H, H, false, m, nm);
    });
  };
  profiler_.time(Op::moe_experts, 2.0 * double(n_rows) * double(3 * F * H), double(bytes_read),
                 experts);

  // x[t] += sum_j weight_j * out[row of choice j], in a fixed order per token.
  profiler_.time(Op::moe_combine, 0, 0, [&] {
    rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* x = x_rows + t * H;
        for (int64_t j = 0; j < K; ++j) {
          const float* out = a.moe_out + int64_t(a.row_of_choice[t * K + j]) * H;
          float w = a.topk_weight[t * K + j];
          for (int64_t i = 0; i < H; ++i) x[i] += w * out[i];
        }
      }
    });
  });
}

}  // namespace ellm
