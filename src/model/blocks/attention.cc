#include "model/blocks/attention.h"

#include <cmath>

#include "kernels/kv_rows.h"
#include "model/blocks/activation.h"

namespace ellm {
namespace {

// Per token: q = rope(q_norm(q)), k = rope(k_norm(k)); k and v into the cache. Plain: q in place
// in the qkv row (norm and RoPE fused); gated: q from beside its gate into b.q, and RoPE on the
// rotary dims only.          qkv: [n][n_heads][hd] (gated: [n][n_heads][2 hd]) | [n_kv_heads][hd] x 2
void qk_norm_rope_to_cache(BlockContext& ctx, const AttentionSpec& s, const AttentionWeights& w,
                           KvCache& kv, int64_t kv_layer, const PassRows& r, AttentionBuffers& b) {
  const int64_t hd = s.head_dim, Q = s.q_dim(), KV = s.kv_dim(), W = s.qkv_width();
  const int64_t q_rows = s.gated ? 2 * Q : Q;
  ctx.profiler.time(Op::qk_norm_rope, 0, 0, [&] {
    ctx.rows(r.size(), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* query = b.qkv + t * W;  // head h at h * hd (gated: h * 2 hd)
        float* k = query + q_rows;     // [n_kv_heads][hd]
        float* v = k + KV;             // [n_kv_heads][hd]
        const float* cos = r.rope_cos + t * (hd / 2);
        const float* sin = r.rope_sin + t * (hd / 2);
        if (s.gated) {
          float* q = b.q + t * Q;
          rmsnorm(query, s.heads, hd, 2 * hd, w.q_norm.get(), s.eps, q, hd);
          rope_partial(q, s.heads, hd, s.rotary_dim, cos, sin);
          rmsnorm(k, s.kv_heads, hd, hd, w.k_norm.get(), s.eps, k, hd);
          rope_partial(k, s.kv_heads, hd, s.rotary_dim, cos, sin);
        } else {
          norm_rope(query, s.heads, hd, w.q_norm.get(), s.eps, cos, sin, query, hd);
          norm_rope(k, s.kv_heads, hd, w.k_norm.get(), s.eps, cos, sin, k, hd);
        }
        const BatchToken& token = r.tokens[t];
        write_kv_row(k, s.kv_heads, hd, kv.dtype(), kv.k_row(kv_layer, token.slot, token.position));
        write_kv_row(v, s.kv_heads, hd, kv.dtype(), kv.v_row(kv_layer, token.slot, token.position));
      }
    });
  });
}

// out = out * sigmoid(gate), the gates in the qkv rows beside each head's query.
void apply_output_gate(BlockContext& ctx, const AttentionSpec& s, int64_t n, AttentionBuffers& b) {
  const int64_t hd = s.head_dim, Q = s.q_dim(), W = s.qkv_width();
  ctx.profiler.time(Op::gate_mul, 0, 0, [&] {
    ctx.rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        for (int64_t h = 0; h < s.heads; ++h) {
          const float* gate = b.qkv + t * W + h * 2 * hd + hd;
          float* o = b.out + t * Q + h * hd;
          for (int64_t d = 0; d < hd; ++d) o[d] *= sigmoid(gate[d]);
        }
    });
  });
}

}  // namespace

AttentionWeights load_attention(TensorLoader& load, const std::string& p, const AttentionSpec& s,
                                NormReader norm) {
  const int64_t H = s.hidden, Q = s.q_dim(), KV = s.kv_dim();
  AttentionWeights w;
  w.qkv = load.packed({p + "q_proj.weight", p + "k_proj.weight", p + "v_proj.weight"},
                      {s.gated ? 2 * Q : Q, KV, KV}, H);
  w.q_norm = (load.*norm)(p + "q_norm.weight", s.head_dim);
  w.k_norm = (load.*norm)(p + "k_norm.weight", s.head_dim);
  w.o_proj = load.packed({p + "o_proj.weight"}, {H}, Q);
  return w;
}

void plan_attention(ActivationPlan& plan, AttentionBuffers& b, const AttentionSpec& spec,
                    const KvCache& kv, int64_t max_tokens, int members) {
  const size_t T = size_t(max_tokens), Q = size_t(spec.q_dim());
  // Plain attention reads q inside the qkv rows; gated leaves its gates there and reads b.q.
  b.shape = {spec.heads,
             spec.kv_heads,
             spec.head_dim,
             /*ldq=*/spec.gated ? spec.q_dim() : spec.qkv_width(),
             /*ldo=*/spec.q_dim(),
             kv.row_stride(),
             1.0f / std::sqrt(float(spec.head_dim)),
             kv.dtype(),
             spec.bf16_products,
             kv.max_positions()};
  plan.carve(b.qkv, T * size_t(spec.qkv_width()));
  plan.carve(b.q, spec.gated ? T * Q : 0);
  plan.carve(b.out, T * Q);
  plan.carve(b.scratch, attention_scratch_floats(b.shape, max_tokens, max_tokens, members));
  b.seqs.resize(T);
}

// qkv = xb @ Wqkv^T                                   qkv: [n][Q + 2 KV]  (gated: [n][2 Q + 2 KV])
void project_qkv_to_cache(BlockContext& ctx, const AttentionSpec& s, const AttentionWeights& w,
                          KvCache& kv, int64_t kv_layer, const PassRows& r, const bf16* xb,
                          AttentionBuffers& b) {
  ctx.gemm(Op::qkv, xb, r.size(), s.hidden, w.qkv, b.qkv, s.qkv_width(), false);
  qk_norm_rope_to_cache(ctx, s, w, kv, kv_layer, r, b);
}

// y (+)= out @ Wo^T                                                    out: [n][Q]
void project_output(BlockContext& ctx, const AttentionSpec& s, const AttentionWeights& w,
                    int64_t n, bf16* xb, AttentionBuffers& b, float* y, bool accumulate) {
  const int64_t Q = s.q_dim();
  if (s.gated) apply_output_gate(ctx, s, n, b);
  ctx.rows(n, [&](int64_t begin, int64_t end) {
    convert_f32_to_bf16(b.out + begin * Q, xb + begin * Q, (end - begin) * Q);
  });
  ctx.gemm(Op::o_proj, xb, n, Q, w.o_proj, y, s.hidden, accumulate);
}

void self_attention(BlockContext& ctx, const AttentionSpec& s, const AttentionWeights& w,
               KvCache& kv, int64_t kv_layer, const PassRows& r, bf16* xb, AttentionBuffers& b) {
  const std::span<const BatchToken> tokens = r.tokens;
  const int64_t n = r.size(), hd = s.head_dim, Q = s.q_dim(), W = s.qkv_width();

  project_qkv_to_cache(ctx, s, w, kv, kv_layer, r, xb, b);

  // Causal GQA attention, one sequence per run of consecutive tokens of one slot.
  int64_t n_seqs = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (t > 0 && tokens[t].slot == tokens[t - 1].slot &&
        tokens[t].position == tokens[t - 1].position + 1) {
      ++b.seqs[n_seqs - 1].n_q;
      continue;
    }
    b.seqs[n_seqs++] = {s.gated ? b.q + t * Q : b.qkv + t * W,
                        b.out + t * Q,
                        1,
                        tokens[t].position,
                        kv.k(kv_layer, tokens[t].slot),
                        kv.v(kv_layer, tokens[t].slot)};
  }
  // Work: QK^T and PV over each query's causal context; bytes: each sequence's K and V once.
  double attention_flops = 0, kv_bytes = 0;
  for (int64_t i = 0; i < n_seqs; ++i) {
    const AttentionSeq& seq = b.seqs[i];
    double contexts =
        double(seq.n_q) * double(seq.q_start) + double(seq.n_q) * double(seq.n_q + 1) / 2;
    attention_flops += 4.0 * double(s.heads * hd) * contexts;
    kv_bytes += 2.0 * double(kv.row_bytes()) * double(seq.q_start + seq.n_q);
  }
  ctx.profiler.time(Op::attention, attention_flops, kv_bytes, [&] {
    ctx.team.run([&](int m, int nm) { attention(b.seqs.data(), n_seqs, b.shape, b.scratch, m, nm); });
  });
  project_output(ctx, s, w, n, xb, b, r.x, /*accumulate=*/true);  // x = x + o_proj(out)
}

}  // namespace ellm
