#include "model/blocks/sparse_attention.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>

namespace ellm {

SparseAttentionWeights load_sparse_attention(TensorLoader& load, const std::string& p,
                                             const SparseAttentionSpec& s) {
  SparseAttentionWeights w;
  w.attention = load_attention(load, p, s.attention, &TensorLoader::vector_f32_plus_one);
  w.index_proj = load.small_matrix(p + "indexer.index_qk_proj.weight", s.index_width(), s.attention.hidden);
  w.q_layernorm = load.vector_f32_plus_one(p + "indexer.q_layernorm.weight", s.index_dim);
  w.k_layernorm = load.vector_f32_plus_one(p + "indexer.k_layernorm.weight", s.index_dim);
  return w;
}

void plan_sparse_attention(ActivationPlan& plan, SparseAttentionBuffers& b, const SparseAttentionSpec& s,
                           const KvCache& kv, int64_t T, int64_t max_positions, int members) {
  plan_attention(plan, b.attention, s.attention, kv, T, members);
  b.max_blocks = max_positions / s.ratio + 1;
  const size_t M = size_t(members), kept = size_t(s.max_kept());
  b.kept_shape = b.attention.shape;
  b.kept_shape.max_positions = s.max_kept();
  b.member_scratch_floats = attention_scratch_floats(b.kept_shape, 1, 1, 1);
  plan.carve(b.index, size_t(T) * size_t(s.index_width()));
  // A short pass has fewer rows than members: its rows use the members' places.
  plan.carve(b.scores, M * size_t(b.max_blocks));
  plan.carve(b.order, M * size_t(b.max_blocks));
  plan.carve(b.kept_k, M * kept * kv.row_bytes());
  plan.carve(b.kept_v, M * kept * kv.row_bytes());
  plan.carve(b.member_scratch, M * b.member_scratch_floats);
  plan.carve(b.shared_scratch, attention_scratch_floats(b.kept_shape, members, members, members));
  b.seqs.resize(size_t(T));
}

void sparse_attention(BlockContext& ctx, const SparseAttentionSpec& s, const SparseAttentionWeights& w,
                      KvCache& kv, int64_t kv_layer, const PassRows& r, const float* u, bf16* xb,
                      const RopeTable& rope, SparseAttentionBuffers& b, float* y) {
  const AttentionSpec& a = s.attention;
  const int64_t n = r.size(), H = a.hidden, hd = a.head_dim, Q = a.q_dim();
  const int64_t IH = s.index_heads, ID = s.index_dim, IW = s.index_width(), C = s.cache_floats();
  const int64_t R = s.ratio;

  // q, k, v as gated attention has them; k and v into the cache.
  project_qkv_to_cache(ctx, a, w.attention, kv, kv_layer, r, xb, b.attention);

  // The indexer's queries (normed, rotated) and raw keys (into the cache).
  ctx.profiler.time(Op::qk_norm_rope, 2.0 * double(n * H * IW), double(w.index_proj.bytes()), [&] {
    ctx.dot_rows(u, n, H, w.index_proj, b.index, IW);
    ctx.rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* q = b.index + t * IW;
        rmsnorm(q, IH, ID, ID, w.q_layernorm.get(), a.eps, q, ID);
        rope_partial(q, IH, ID, a.rotary_dim, r.rope_cos + t * (hd / 2), r.rope_sin + t * (hd / 2));
        const BatchToken& token = r.tokens[t];
        float* cached = kv.extra(kv_layer, token.slot) + int64_t(token.position) * C;
        std::copy_n(q + IH * ID, ID, cached);
        for (int i = 0; i < 3; ++i) cached[2 * ID + i] = float(token.rope[i]);
      }
    });
  });

  // The key of each block the rows complete, once all the rows' raw keys are in.
  ctx.rows(n, [&](int64_t begin, int64_t end) {
    float cos[256], sin[256];  // rotary dims / 2 <= 256 (checked at load)
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
      BatchToken at_first{0, token.slot, int32_t(first), false};  // at its rope position
      for (int i = 0; i < 3; ++i) at_first.rope[i] = int32_t(raw[2 * ID + i]);
      token_rope_angles(at_first, rope, cos, sin);
      rope_partial(block, 1, ID, a.rotary_dim, cos, sin);
    }
  });

  // Per row: the indexer's block scores, the kept positions, and their K and V rows gathered in
  // order; then attention over the gathered rows as over a context of n_kept positions (or over
  // the cache itself where every position is kept). A short pass (decode) splits each row's
  // blocks and then the attention among the members; a long one gives each member its rows.
  const float index_scale = 1.0f / std::sqrt(float(ID));
  const size_t row_bytes = kv.row_bytes();
  const bool short_pass = n < ctx.team.size();
  auto score_blocks = [&](int64_t t, int64_t first, int64_t last, float* scores) {
    const BatchToken& token = r.tokens[t];
    const float* cache = kv.extra(kv_layer, token.slot);
    const float* q = b.index + t * IW;
    float dots[kMaxIndexHeads];
    for (int64_t blk = first; blk < last; ++blk) {
      dot_rows_f32(q, IH, ID, cache + (blk * R + R - 1) * C + ID, 1, ID, dots, 1);
      float score = 0;
      for (int64_t i = 0; i < IH; ++i) score += std::max(dots[i], 0.0f);
      scores[blk] = score * index_scale;
    }
  };
  // Row t's attention sequence: the K and V rows of its kept positions (scores: its blocks'),
  // gathered in position order into place `into`.
  auto select_and_gather = [&](int64_t t, const float* scores, int64_t into) {
    const BatchToken& token = r.tokens[t];
    const int64_t p = token.position, blocks = (p + 1) / R;
    AttentionSeq& seq = b.seqs[size_t(t)];
    seq = {b.attention.q + t * Q, b.attention.out + t * Q, 1, p, kv.k(kv_layer, token.slot),
           kv.v(kv_layer, token.slot)};
    if (blocks <= s.top_blocks()) return;  // every position: the cache as it is
    int32_t* order = b.order + into * b.max_blocks;
    for (int64_t blk = 0; blk < blocks; ++blk) order[blk] = int32_t(blk);
    const int64_t n_blocks = s.top_blocks();
    std::nth_element(order, order + n_blocks - 1, order + blocks, [&](int32_t x, int32_t z) {
      return scores[x] > scores[z] || (scores[x] == scores[z] && x < z);
    });
    std::sort(order, order + n_blocks);
    uint8_t* k = b.kept_k + size_t(into) * size_t(s.max_kept()) * row_bytes;
    uint8_t* v = b.kept_v + size_t(into) * size_t(s.max_kept()) * row_bytes;
    int64_t n_kept = 0;
    auto keep = [&](int64_t pos) {
      std::memcpy(k + size_t(n_kept) * row_bytes, kv.k_row(kv_layer, token.slot, pos), row_bytes);
      std::memcpy(v + size_t(n_kept) * row_bytes, kv.v_row(kv_layer, token.slot, pos), row_bytes);
      ++n_kept;
    };
    for (int64_t i = 0; i < n_blocks; ++i)
      for (int64_t j = 0; j < R; ++j) keep(int64_t(order[i]) * R + j);
    for (int64_t pos = blocks * R; pos <= p; ++pos) keep(pos);
    seq.q_start = n_kept - 1;
    seq.k = k;
    seq.v = v;
  };

  double index_flops = 0, kept_positions = 0;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = r.tokens[t].position;
    index_flops += 2.0 * double((p + 1) / R) * double(IH * ID);
    kept_positions += double(std::min(p + 1, s.max_kept()));
  }
  const double index_bytes = index_flops / double(IH) * 2.0;  // each block key's floats once
  const double attention_flops = 4.0 * double(a.heads * hd) * kept_positions;
  const double kept_bytes = 2.0 * double(row_bytes) * kept_positions;
  if (short_pass) {  // each row's blocks split among the members, then its attention
    ctx.profiler.time(Op::indexer, index_flops, index_bytes, [&] {
      ctx.team.run([&](int m, int nm) {
        for (int64_t t = 0; t < n; ++t) {
          auto [first, last] = split_range((r.tokens[t].position + 1) / R, m, nm);
          score_blocks(t, first, last, b.scores + t * b.max_blocks);
        }
      });
    });
    ctx.profiler.time(Op::attention, attention_flops, kept_bytes, [&] {
      ctx.rows(n, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) select_and_gather(t, b.scores + t * b.max_blocks, t);
      });
      ctx.team.run([&](int m, int nm) { attention(b.seqs.data(), n, b.kept_shape, b.shared_scratch, m, nm); });
    });
  } else {  // each member its rows, one after another: scores, kept positions, attention
    const bool timed = ctx.profiler.sink() != nullptr;
    std::atomic<int64_t> index_ns{0};
    const auto start = std::chrono::steady_clock::now();
    ctx.team.run([&](int m, int nm) {
      auto [begin, end] = split_range(n, m, nm);
      float* scores = b.scores + m * b.max_blocks;
      std::chrono::steady_clock::duration indexing{};
      for (int64_t t = begin; t < end; ++t) {
        const auto scored = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
        score_blocks(t, 0, (r.tokens[t].position + 1) / R, scores);
        if (timed) indexing += std::chrono::steady_clock::now() - scored;
        select_and_gather(t, scores, m);
        attention(&b.seqs[size_t(t)], 1, b.kept_shape, b.member_scratch + m * b.member_scratch_floats, 0, 1);
      }
      index_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(indexing).count();
    });
    if (timed) {  // the indexer's share: the members' mean time in it
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double indexing = double(index_ns.load()) * 1e-9 / double(ctx.team.size());
      ctx.profiler.add(Op::indexer, indexing, index_flops, index_bytes);
      ctx.profiler.add(Op::attention, seconds - indexing, attention_flops, kept_bytes);
    }
  }

  project_output(ctx, a, w.attention, n, xb, b.attention, y, /*accumulate=*/false);
}

}  // namespace ellm
