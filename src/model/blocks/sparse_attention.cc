#include "model/blocks/sparse_attention.h"

#include <algorithm>
#include <cmath>

#include "kernels/kv_rows.h"

namespace ellm {

SparseAttentionWeights load_sparse_attention(TensorLoader& load, const std::string& p,
                                             const SparseAttentionSpec& s) {
  SparseAttentionWeights w;
  w.attention = load_attention(load, p, s.attention, &TensorLoader::vector_f32_plus_one);
  w.index_proj = load.matrix_f32(p + "indexer.index_qk_proj.weight", s.index_width(), s.attention.hidden);
  w.q_layernorm = load.vector_f32_plus_one(p + "indexer.q_layernorm.weight", s.index_dim);
  w.k_layernorm = load.vector_f32_plus_one(p + "indexer.k_layernorm.weight", s.index_dim);
  return w;
}

void plan_sparse_attention(ActivationPlan& plan, SparseAttentionBuffers& b, const SparseAttentionSpec& s,
                           const KvCache& kv, int64_t T, int64_t max_positions, int members) {
  plan_attention(plan, b.attention, s.attention, kv, T, members);
  b.max_blocks = max_positions / s.ratio + 1;
  const size_t M = size_t(members);
  plan.carve(b.index, size_t(T) * size_t(s.index_width()));
  plan.carve(b.scores, M * size_t(b.max_blocks));
  plan.carve(b.order, M * size_t(b.max_blocks));
  plan.carve(b.kept, M * size_t(s.max_kept()));
  plan.carve(b.weights, M * size_t(s.max_kept()));
}

void sparse_attention(BlockContext& ctx, const SparseAttentionSpec& s, const SparseAttentionWeights& w,
                      KvCache& kv, int64_t kv_layer, const PassRows& r, const float* u, bf16* xb,
                      const RopeTable& rope, SparseAttentionBuffers& b, float* y) {
  const AttentionSpec& a = s.attention;
  const int64_t n = r.size(), H = a.hidden, hd = a.head_dim, Q = a.q_dim();
  const int64_t IH = s.index_heads, ID = s.index_dim, IW = s.index_width(), C = s.cache_floats();
  const int64_t R = s.ratio, rotary_half = a.rotary_dim / 2;

  // q, k, v as gated attention has them; k and v into the cache.
  project_qkv_to_cache(ctx, a, w.attention, kv, kv_layer, r, xb, b.attention);

  // The indexer's queries (normed, rotated) and raw keys (into the cache).
  ctx.profiler.time(Op::qk_norm_rope, 2.0 * double(n * H * IW), 0, [&] {
    ctx.rows(n, [&](int64_t begin, int64_t end) {
      dot_rows_f32(u + begin * H, end - begin, H, w.index_proj.get(), IW, H, b.index + begin * IW, IW);
      for (int64_t t = begin; t < end; ++t) {
        float* q = b.index + t * IW;
        rmsnorm(q, IH, ID, ID, w.q_layernorm.get(), a.eps, q, ID);
        rope_partial(q, IH, ID, a.rotary_dim, r.rope_cos + t * (hd / 2), r.rope_sin + t * (hd / 2));
        const BatchToken& token = r.tokens[t];
        std::copy_n(q + IH * ID, ID, kv.extra(kv_layer, token.slot) + int64_t(token.position) * C);
      }
    });
  });

  // The key of each block the rows complete, once all the rows' raw keys are in.
  ctx.rows(n, [&](int64_t begin, int64_t end) {
    float cos[256], sin[256];  // rotary_half <= 256 (checked at load)
    for (int64_t t = begin; t < end; ++t) {
      const BatchToken& token = r.tokens[t];
      if (token.position % R != R - 1) continue;
      const int64_t first = token.position - (R - 1);
      const float* raw = kv.extra(kv_layer, token.slot) + first * C;
      float* block = kv.extra(kv_layer, token.slot) + int64_t(token.position) * C + ID;
      for (int64_t d = 0; d < ID; ++d) {
        float sum = 0;
        for (int64_t i = 0; i < R; ++i) sum += raw[i * C + d];
        block[d] = sum / float(R);
      }
      rmsnorm(block, 1, ID, ID, w.k_layernorm.get(), a.eps, block, ID);
      rope_angles(first, rope.inv_freq.data(), rotary_half, rope.attention_factor, cos, sin);
      rope_partial(block, 1, ID, a.rotary_dim, cos, sin);
    }
  });

  // Per row: the kept positions, then attention over them, head by head.
  const int64_t heads_per_kv = a.heads / a.kv_heads;
  const float index_scale = 1.0f / std::sqrt(float(ID)), scale = 1.0f / std::sqrt(float(hd));
  ctx.profiler.time(Op::attention, 0, 0, [&] {
    ctx.team.run([&](int m, int nm) {
      auto [begin, end] = split_range(n, m, nm);
      float* scores = b.scores + m * b.max_blocks;
      int32_t* order = b.order + m * b.max_blocks;
      int32_t* kept = b.kept + m * s.max_kept();
      float* weights = b.weights + m * s.max_kept();
      for (int64_t t = begin; t < end; ++t) {
        const BatchToken& token = r.tokens[t];
        const int64_t p = token.position, blocks = (p + 1) / R;
        const float* cache = kv.extra(kv_layer, token.slot);
        const float* q = b.index + t * IW;
        for (int64_t blk = 0; blk < blocks; ++blk) {
          const float* key = cache + (blk * R + R - 1) * C + ID;
          float score = 0;
          for (int64_t i = 0; i < IH; ++i) {
            float dot = 0;
            for (int64_t d = 0; d < ID; ++d) dot += q[i * ID + d] * key[d];
            score += std::max(dot, 0.0f);
          }
          scores[blk] = score * index_scale;
          order[blk] = int32_t(blk);
        }
        int64_t n_blocks = blocks;
        if (blocks > s.top_blocks()) {
          n_blocks = s.top_blocks();
          std::nth_element(order, order + n_blocks - 1, order + blocks, [&](int32_t x, int32_t z) {
            return scores[x] > scores[z] || (scores[x] == scores[z] && x < z);
          });
          std::sort(order, order + n_blocks);
        }
        int64_t n_kept = 0;
        for (int64_t i = 0; i < n_blocks; ++i)
          for (int64_t j = 0; j < R; ++j) kept[n_kept++] = int32_t(order[i] * R + j);
        for (int64_t pos = blocks * R; pos <= p; ++pos) kept[n_kept++] = int32_t(pos);

        const KvDtype dtype = kv.dtype();
        for (int64_t h = 0; h < a.heads; ++h) {
          const float* qh = b.attention.q + t * Q + h * hd;
          const int64_t kvh = h / heads_per_kv;
          float top = -INFINITY;
          for (int64_t j = 0; j < n_kept; ++j) {
            const uint8_t* k = kv.k_row(kv_layer, token.slot, kept[j]);
            float dot = 0;
            for (int64_t d = 0; d < hd; ++d) dot += qh[d] * kv_element(k, dtype, a.kv_heads, hd, kvh, d);
            weights[j] = dot * scale;
            top = std::max(top, weights[j]);
          }
          float sum = 0;
          for (int64_t j = 0; j < n_kept; ++j) {
            weights[j] = std::exp(weights[j] - top);
            sum += weights[j];
          }
          float* o = b.attention.out + t * Q + h * hd;
          std::fill_n(o, hd, 0.0f);
          for (int64_t j = 0; j < n_kept; ++j) {
            const uint8_t* v = kv.v_row(kv_layer, token.slot, kept[j]);
            const float pj = weights[j] / sum;
            for (int64_t d = 0; d < hd; ++d) o[d] += pj * kv_element(v, dtype, a.kv_heads, hd, kvh, d);
          }
        }
      }
    });
  });

  project_output(ctx, a, w.attention, n, xb, b.attention, y, /*accumulate=*/false);
}

}  // namespace ellm
