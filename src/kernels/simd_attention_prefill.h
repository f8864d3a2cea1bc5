#pragma once
// Prefill attention (attention_block, contract in kernels/kernel_table.h), written once over a
// vector-traits type V (kernels/vec_*.h) and instantiated by each SIMD tier with its own compile
// flags (kernels/<tier>/attention.cc). Small GEMMs: the K block is transposed once into the
// scratch ([head_dim][positions]), so scores for R query rows x up to P = L * kPrefillVectors
// positions are register accumulators fed by one broadcast q element per FMA row, with no
// horizontal reduction per (row, position). Then per row the online-softmax update, and
// O += P.V for the same R rows, L * kPrefillVectors output dimensions at a time.
//
// K and V rows are fetched ahead (V::kAheadPositions; 0: the next sub-block). Positions are a
// whole cache row apart (all KV heads, 2 KiB for Qwen3-0.6B) and one head reads a few lines of
// each: the hardware prefetchers see no stream in that.
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/kernel_table.h"
#include "kernels/simd_elementwise.h"
#include "kernels/simd_kv_load.h"

namespace ellm::simd {

// The largest of s[0:n) (n > 0).
template <class V>
inline float row_max(const float* s, int64_t n) {
  auto vmax = V::set1(-INFINITY);
  int64_t i = for_vectors<V>(n, [&](int64_t j, int64_t left) { vmax = V::max_first(vmax, V::load(s + j), left); });
  float m = V::hmax(vmax);
  for (; i < n; ++i) m = std::max(m, s[i]);
  return m;
}

// The factor a row's accumulated output is scaled by when its maximum moves from m to new_max:
// 0 on the first block (m = -inf); 1, without an exp, when the maximum did not move.
inline float softmax_correction(float m, float new_max) {
  return new_max == m ? 1.0f : std::exp(m - new_max);
}

namespace prefill {

// kt[d][j] = k[j * ldk + d] widened (KvLoad) for j < width, zero for width <= j < ldt; fetches
// rows further on (`ahead`) meanwhile. L positions x L dims at a time go by the tier's 8x8 (16x16)
// transpose of the widened rows; the rest a row's vector at a time, scattered.
template <class V, KvDtype D>
void transpose_block(const typename KvLoad<V, D>::E* k, int64_t ldk, int64_t width,
                     int64_t head_dim, float* kt, int64_t ldt, const typename KvLoad<V, D>::E* ahead) {
  using Load = KvLoad<V, D>;
  constexpr int64_t L = V::kLanes;
  // Dimensions between two fetches of a row's lines: FP16 as tuned; one-byte codes once a line.
  constexpr int64_t kFetchDims = D == KvDtype::f16 ? V::kPrefetchDims : 64 / int64_t(sizeof(typename Load::E));
  const int64_t full_d = head_dim / L * L, full_j = width / L * L;
  alignas(64) float column[L];
  for (int64_t j = 0; j < full_j; j += L) {  // L positions x L dims: widened, then transposed
    for (int64_t d = 0; d < full_d; d += L) {
      if (d % kFetchDims == 0)
        for (int64_t r = 0; r < L; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(ahead + (j + r) * ldk + d), V::kPrefetchHint);
      typename V::F rows[L];
      for (int64_t r = 0; r < L; ++r) rows[r] = Load::load(k + (j + r) * ldk + d);
      V::transpose_rows(rows, kt + d * ldt + j, ldt);
    }
    for (int64_t d = full_d; d < head_dim; ++d)
      for (int64_t r = 0; r < L; ++r) {
        V::store(column, Load::load(k + (j + r) * ldk + d, 1));
        kt[d * ldt + j + r] = column[0];
      }
  }
  for (int64_t j = full_j; j < width; ++j) {  // the last positions a row's vector at a time
    _mm_prefetch(reinterpret_cast<const char*>(ahead + j * ldk), V::kPrefetchHint);
    for (int64_t d = 0; d < full_d; d += L) {
      V::store(column, Load::load(k + j * ldk + d));
      for (int64_t i = 0; i < L; ++i) kt[(d + i) * ldt + j] = column[i];
    }
    for (int64_t d = full_d; d < head_dim; ++d) {
      V::store(column, Load::load(k + j * ldk + d, 1));
      kt[d * ldt + j] = column[0];
    }
  }
  for (int64_t d = 0; d < head_dim; ++d)
    for (int64_t j = width; j < ldt; ++j) kt[d * ldt + j] = 0.0f;
}

// s[i][0:L NV] = scale * q_i . kt for R rows (FP8: (q_i . kt) * k_factors * scale).
template <class V, int R, int NV>
void scores(const float* const* q, const float* kt, int64_t ldt, int64_t head_dim, float scale,
            const float* k_factors, float* s) {
  constexpr int L = V::kLanes;
  typename V::F c[R][NV];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int t = 0; t < NV; ++t) c[i][t] = V::zero();
  for (int64_t d = 0; d < head_dim; ++d) {
    typename V::F kv[NV];
#pragma GCC unroll 4
    for (int t = 0; t < NV; ++t) kv[t] = V::load(kt + d * ldt + L * t);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      auto qb = V::set1(q[i][d]);
#pragma GCC unroll 4
      for (int t = 0; t < NV; ++t) c[i][t] = V::fmadd(qb, kv[t], c[i][t]);
    }
  }
  auto vscale = V::set1(scale);
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int t = 0; t < NV; ++t) {
      if (k_factors) c[i][t] = V::mul(c[i][t], V::load(k_factors + L * t));
      V::store(s + i * ldt + L * t, V::mul(c[i][t], vscale));
    }
}

// Online-softmax update of one row: s[0:ldt] scores in, probabilities out (zero past
// `visible`); returns the factor the row's accumulated output must be scaled by.
template <class V>
float softmax_row(float* s, int64_t visible, int64_t ldt, float& m, float& l) {
  constexpr int64_t L = V::kLanes;
  if (visible <= 0) {
    for (int64_t j = 0; j < ldt; j += L) V::store(s + j, V::zero());
    return 1.0f;
  }
  const float new_max = std::max(m, row_max<V>(s, visible));
  const float correction = softmax_correction(m, new_max);
  auto vsum = V::zero(), vnew_max = V::set1(new_max);
  for (int64_t j = 0; j < ldt; j += L) {
    auto p = V::zero_unless(V::first_lanes(visible - j), exp<V>(V::sub(V::load(s + j), vnew_max)));
    vsum = V::add(vsum, p);
    V::store(s + j, p);
  }
  l = l * correction + V::hsum(vsum);
  m = new_max;
  return correction;
}

// acc_i = acc_i * correction_i + p_i . v[0:count] for R rows, L * kPrefillVectors dimensions at
// a time; rows with a null acc are computed but not stored. With `ahead_v`, fetches those rows
// meanwhile (one line per 32 dimensions). FP8: p weighs row j as p * v_factors[j].
template <class V, KvDtype D, int R>
void accumulate(float* const* acc, const float* correction, const float* p, int64_t ldp,
                const typename KvLoad<V, D>::E* v, int64_t ldv, int64_t count, int64_t head_dim,
                const typename KvLoad<V, D>::E* ahead_v, const float* v_factors) {
  constexpr int L = V::kLanes, NV = V::kPrefillVectors;
  for (int64_t d0 = 0; d0 < head_dim; d0 += L * NV) {
    int64_t left[NV];  // dimensions left from each vector on (<= 0: none)
    typename V::F a[R][NV];
#pragma GCC unroll 4
    for (int t = 0; t < NV; ++t) left[t] = head_dim - d0 - L * t;
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      auto c = V::set1(correction[i]);
      const float* src = acc[i] ? acc[i] : acc[0];
#pragma GCC unroll 4
      for (int t = 0; t < NV; ++t)
        a[i][t] = left[t] > 0 ? V::mul(V::load(src + d0 + L * t, left[t]), c) : V::zero();
    }
    for (int64_t j = 0; j < count; ++j) {
      const auto* vj = v + j * ldv + d0;
      if (ahead_v)
        for (int t = 0; t < NV && left[t] > 0; t += 32 / L)
          if ((d0 + L * t) % 32 == 0)
            _mm_prefetch(reinterpret_cast<const char*>(ahead_v + j * ldv + d0 + L * t), V::kPrefetchHint);
      typename V::F vv[NV];
#pragma GCC unroll 4
      for (int t = 0; t < NV; ++t) vv[t] = left[t] > 0 ? KvLoad<V, D>::load(vj + L * t, left[t]) : V::zero();
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        auto pb = V::set1(v_factors ? p[i * ldp + j] * v_factors[j] : p[i * ldp + j]);
#pragma GCC unroll 4
        for (int t = 0; t < NV; ++t) a[i][t] = V::fmadd(pb, vv[t], a[i][t]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
      if (acc[i])
#pragma GCC unroll 4
        for (int t = 0; t < NV; ++t)
          if (left[t] > 0) V::store(acc[i] + d0 + L * t, a[i][t], left[t]);
  }
}

// attention_block over positions [p0, p1), at most L * kPrefillVectors of them, R rows a tile.
template <class V, KvDtype D, int R>
void sub_block(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
               const void* k_cache, const void* v_cache, const float* k_factors,
               const float* v_factors, int64_t ldkv, int64_t p0, int64_t p1, int64_t head_dim,
               float scale, float* m, float* l, float* acc, float* scratch) {
  using Load = KvLoad<V, D>;
  constexpr int64_t L = V::kLanes;
  const auto* k = static_cast<const typename Load::E*>(k_cache);
  const auto* v = static_cast<const typename Load::E*>(v_cache);
  const int64_t width = p1 - p0, ldt = (width + L - 1) / L * L;
  const int64_t ahead = V::kAheadPositions ? p0 + V::kAheadPositions : p1;
  float* kt = scratch;             // [head_dim][ldt]
  float* s = kt + head_dim * ldt;  // [R][ldt]
  float* kf = s + R * ldt;         // FP8: [ldt] the K rows' factors, then [ldt] the V rows'
  float* vf = kf + ldt;
  if constexpr (Load::kFactors)
    for (int64_t j = 0; j < ldt; ++j) {
      kf[j] = j < width ? Load::factor(k_factors, ldkv, p0 + j) : 0.0f;
      vf[j] = j < width ? Load::factor(v_factors, ldkv, p0 + j) : 0.0f;
    }
  const float* kfs = Load::kFactors ? kf : nullptr;
  const float* vfs = Load::kFactors ? vf : nullptr;
  transpose_block<V, D>(k + p0 * ldkv, ldkv, width, head_dim, kt, ldt, k + ahead * ldkv);
  for (int64_t r0 = 0; r0 < rows; r0 += R) {
    // Positions the tile's last row sees; rows before the first visible position skip the block.
    const int64_t last = std::min(rows, r0 + R) - 1;
    const int64_t tile_visible = std::min(p1, first_end + last / group) - p0;
    if (tile_visible <= 0) continue;
    const float* qr[R];
    float* acc_rows[R];
    for (int i = 0; i < R; ++i) {
      int64_t r = std::min(r0 + i, last);
      qr[i] = q + (r / group) * ldq + (r % group) * head_dim;
      acc_rows[i] = r0 + i <= last ? acc + r * head_dim : nullptr;
    }
    const int64_t tile_vecs = (tile_visible + L - 1) / L;
    switch (tile_vecs) {
      case 1: scores<V, R, 1>(qr, kt, ldt, head_dim, scale, kfs, s); break;
      case 2: scores<V, R, 2>(qr, kt, ldt, head_dim, scale, kfs, s); break;
      case 3: if constexpr (V::kPrefillVectors >= 3) scores<V, R, 3>(qr, kt, ldt, head_dim, scale, kfs, s); break;
      default: scores<V, R, V::kPrefillVectors>(qr, kt, ldt, head_dim, scale, kfs, s); break;
    }
    float correction[R];
    for (float& c : correction) c = 1.0f;
    for (int i = 0; i < R && r0 + i <= last; ++i) {
      const int64_t r = r0 + i;
      const int64_t visible = std::min(p1, first_end + r / group) - p0;
      correction[i] = softmax_row<V>(s + i * ldt, visible, tile_vecs * L, m[r], l[r]);
    }
    accumulate<V, D, R>(acc_rows, correction, s, ldt, v + p0 * ldkv, ldkv, tile_visible, head_dim,
                        r0 == 0 ? v + ahead * ldkv : nullptr, vfs);
  }
}

}  // namespace prefill

// attention_block: sub-blocks of L * kPrefillVectors positions, tiles of 4 query rows (2 when a
// block has only 2 rows, where V::kPairTiles); head_dim not a multiple of L goes to the scalar
// tier where V has no masked tails.
template <class V, KvDtype D>
void attention_block(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
                     const void* k, const void* v, const float* k_factors, const float* v_factors,
                     int64_t ldkv, int64_t p0, int64_t p1, int64_t head_dim, float scale, float* m,
                     float* l, float* acc, float* s) {
  if (!V::kMaskedTail && head_dim % V::kLanes)
    return scalar_kernels.attention_block_for(D)(q, ldq, group, rows, first_end, k, v, k_factors,
                                                 v_factors, ldkv, p0, p1, head_dim, scale, m, l,
                                                 acc, s);
  constexpr int64_t kPositions = V::kLanes * V::kPrefillVectors;
  auto run = V::kPairTiles && rows <= 2 ? prefill::sub_block<V, D, 2> : prefill::sub_block<V, D, 4>;
  for (int64_t p = p0; p < p1; p += kPositions)
    run(q, ldq, group, rows, first_end, k, v, k_factors, v_factors, ldkv, p,
        std::min(p1, p + kPositions), head_dim, scale, m, l, acc, s);
}

}  // namespace ellm::simd
