#pragma once
// Decode attention (attention_block_all_heads, contract in kernels/kernel_table.h), written once
// over a vector-traits type V (kernels/vec_*.h) and instantiated by each SIMD tier with its own
// compile flags (kernels/<tier>/attention.cc).
//
// L = V::kLanes (KV head, query row) pairs go as the lanes of a vector, L positions at a time: the
// K pass gives, per position, the pairs' scores as one vector (dot_block, then one add tree), the
// online softmax is lane-wise over positions, and P.V goes head by head from cache (its V lines
// were fetched during the K pass). K and V rows are read in memory order.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/kernel_table.h"
#include "kernels/row_fetch.h"
#include "kernels/simd_elementwise.h"
#include "kernels/simd_kv_load.h"

namespace ellm::simd {

// acc[r] += sum_j p[j * L + r] v_j for R rows of one head (L * NV dims), j < count, V::kPvVectors
// vectors of dimensions at a time. With `fetch`, fetches some of its lines per position.
template <class V, KvDtype D, int R, int NV>
void add_pv(const float* p, int64_t count, const typename KvLoad<V, D>::E* v, int64_t ldv, float* acc,
            RowFetch* fetch) {
  // C vectors of dimensions a pass over the positions: R * C accumulators at most kPvVectors.
  constexpr int L = V::kLanes, C = NV < V::kPvVectors / R ? NV : V::kPvVectors / R;
  // The fetch's cursor in registers for the loop, not stored back at every step.
  RowFetch local_fetch = fetch ? *fetch : RowFetch();
  for (int c0 = 0; c0 < NV; c0 += C) {
    typename V::F a[R][C];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) a[r][c] = V::load(acc + r * L * NV + L * (c0 + c));
    for (int64_t j = 0; j < count; ++j) {
      typename V::F pj[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) pj[r] = V::set1(p[j * L + r]);
      if (fetch) local_fetch.step<V::pv_fetch_lines(C)>();
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) {
        auto vc = KvLoad<V, D>::load(v + j * ldv + L * (c0 + c));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) a[r][c] = V::fmadd(pj[r], vc, a[r][c]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) V::store(acc + r * L * NV + L * (c0 + c), a[r][c]);
  }
  if (fetch) *fetch = local_fetch;
}

// dots[j][lane0 + r] = L partial sums of q_r . k_{p0 + j} for ROWS rows of one KV head and
// L / ROWS positions (positions past `last` repeat it; the caller masks them). q[r] points at
// row r's query, k at position 0 of the head. Fetches some of `fetch`'s lines per L dims.
template <class V, KvDtype D, int NV, int ROWS>
inline void dot_block(const float* const* q, const typename KvLoad<V, D>::E* k, int64_t ldk,
                      int64_t p0, int64_t last, typename V::F (*dots)[V::kLanes], int lane0,
                      RowFetch& fetch) {
  constexpr int L = V::kLanes, kPositions = L / ROWS;
  const typename KvLoad<V, D>::E* kj[kPositions];
#pragma GCC unroll 16
  for (int j = 0; j < kPositions; ++j) kj[j] = k + std::min<int64_t>(p0 + j, last) * ldk;
  typename V::F a[kPositions][ROWS];
#pragma GCC unroll 16
  for (int j = 0; j < kPositions; ++j)
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) a[j][r] = V::zero();
#pragma GCC unroll 4
  for (int c = 0; c < NV; ++c) {
    typename V::F qc[ROWS];
    if constexpr (V::kQInRegisters)
#pragma GCC unroll 8
      for (int r = 0; r < ROWS; ++r) qc[r] = V::load(q[r] + L * c);
    fetch.step<V::dot_fetch_lines(ROWS)>();
#pragma GCC unroll 16
    for (int j = 0; j < kPositions; ++j) {
      auto kc = KvLoad<V, D>::load(kj[j] + L * c);
#pragma GCC unroll 8
      for (int r = 0; r < ROWS; ++r)
        a[j][r] = V::fmadd(kc, V::kQInRegisters ? qc[r] : V::load(q[r] + L * c), a[j][r]);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < kPositions; ++j)
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) dots[j][lane0 + r] = a[j][r];
}

// For every position j of a block (the last again past `count`), the factor of each lane's head
// (lane t: head h0 + t / ROWS, the last one again past `heads`), as kv_factor gives them.
// A row's factors of heads [h0, h0 + heads) are one vector; lane t takes its head's.
template <class V, KvDtype D, int ROWS>
void lane_factors(const float* factors, int64_t ldkv, int64_t j0, int64_t count, int64_t h0,
                  int64_t heads, float (*out)[V::kLanes]) {
  constexpr int L = V::kLanes;
  alignas(64) int32_t head_of_lane[L];
  for (int t = 0; t < L; ++t) head_of_lane[t] = int32_t(std::min<int64_t>(t / ROWS, heads - 1));
  const auto index = V::load_i(head_of_lane);
  const auto widened = V::set1(KvLoad<V, D>::kWidenedFactor);
  const auto* row = reinterpret_cast<const uint8_t*>(factors + h0);
  for (int j = 0; j < L; ++j) {
    const auto* at = reinterpret_cast<const float*>(row + (j0 + std::min<int64_t>(j, count - 1)) * ldkv);
    typename V::F head_factors;
    if constexpr (V::kMaskedTail) {
      head_factors = V::load(at, heads);
    } else {  // no reading past the row's last factor
      alignas(64) float copy[L] = {};
      std::memcpy(copy, at, size_t(heads) * sizeof(float));
      head_factors = V::load(copy);
    }
    V::store(out[j], V::mul(V::permute(head_factors, index), widened));
  }
}

// head_dim = L * NV, ROWS query rows per KV head.
template <class V, KvDtype D, int NV, int ROWS>
void all_heads(const float* q, int64_t ldq, int64_t n_kv_heads, int64_t group, int64_t first_end,
               const void* k_cache, const void* v_cache, const float* k_factors,
               const float* v_factors, int64_t ldkv, int64_t p0, int64_t p1, float scale,
               float* m, float* l, float* acc, float* scratch) {
  using F = typename V::F;
  using Load = KvLoad<V, D>;
  const auto* k = static_cast<const typename Load::E*>(k_cache);
  const auto* v = static_cast<const typename Load::E*>(v_cache);
  constexpr int L = V::kLanes;
  constexpr int64_t kHeadDim = L * NV;
  constexpr int kHeads = L / ROWS;
  float* p = scratch;  // [L positions][L lanes] probabilities
  // [position][lane]: L partial sums of the lane's dot product. Lanes past the last head keep
  // zeros or an earlier group's finite values; the lane masks below drop them.
  F dots[L][L] = {};
  const F vscale = V::set1(scale), minus_inf = V::set1(-INFINITY), one = V::set1(1.0f);
  for (int64_t j0 = p0; j0 < p1; j0 += L) {
    const int64_t count = std::min<int64_t>(L, p1 - j0);
    for (int64_t h0 = 0; h0 < n_kv_heads; h0 += kHeads) {
      const int64_t heads = std::min<int64_t>(kHeads, n_kv_heads - h0), used = heads * ROWS;
      const float* qr[L];  // lane t: head h0 + t / ROWS (the last one again past the end), row t % ROWS
      alignas(64) int32_t visible[L];  // positions of the block lane t may see
      for (int t = 0; t < L; ++t) {
        int64_t h = h0 + std::min<int64_t>(t / ROWS, heads - 1), r = t % ROWS;
        qr[t] = q + (r / group) * ldq + (h * group + r % group) * kHeadDim;
        visible[t] = int32_t(std::clamp<int64_t>(first_end + r / group - j0, 0, count));
      }
      const auto vis = V::load_i(visible);
      auto in_block = [&](int j) { return V::lanes_greater(vis, V::set1_i(j)); };

      // s[j] lane t = scale * q_t . k_j. Register blocks of L / ROWS positions x ROWS rows of one
      // head: each K chunk is converted once and serves every row.
      // Memory streams while the compute runs: the K pass fetches this block's V, P.V the next
      // block's K, each in memory order, a few lines per step: half a block ahead. A whole block
      // ahead was slower at long contexts: a block's K and V (64 KiB for Qwen3-0.6B at 16
      // positions) overflow L1, so lines fetched that early left it before use.
      const int64_t next = std::min<int64_t>(L, p1 - j0 - L);
      RowFetch this_v(v + h0 * kHeadDim, j0, count, ldkv, heads * kHeadDim);
      RowFetch next_k(k + h0 * kHeadDim, j0 + L, next, ldkv, heads * kHeadDim);
      for (int64_t hh = 0; hh < heads; ++hh)
        for (int jb = 0; jb < L; jb += L / ROWS)
          dot_block<V, D, NV, ROWS>(qr + hh * ROWS, k + (h0 + hh) * kHeadDim, ldkv, j0 + jb,
                                 j0 + count - 1, dots + jb, int(hh * ROWS), this_v);
      F s[L];
      alignas(64) float factors[L][L];  // FP8: [position][lane] the K (then V) row's factor
      if constexpr (Load::kFactors) lane_factors<V, D, ROWS>(k_factors, ldkv, j0, count, h0, heads, factors);
      for (int j = 0; j < L; ++j) {
        s[j] = V::sum_lanes(dots[j]);
        if constexpr (Load::kFactors) s[j] = V::mul(s[j], V::load(factors[j]));
        s[j] = V::mul(s[j], vscale);
      }
      if constexpr (Load::kFactors) lane_factors<V, D, ROWS>(v_factors, ldkv, j0, count, h0, heads, factors);

      // Online softmax, lane-wise. A lane that has seen no position keeps m = -inf, correction 1.
      const int64_t i0 = h0 * ROWS;
      alignas(64) float m_lanes[L], l_lanes[L], corr[L];
      for (int t = 0; t < L; ++t)
        m_lanes[t] = t < used ? m[i0 + t] : -INFINITY, l_lanes[t] = t < used ? l[i0 + t] : 0.0f;
      F m_old = V::load(m_lanes), m_new = m_old;
      for (int j = 0; j < L; ++j) m_new = V::select(in_block(j), m_new, V::max(m_new, s[j]));
      auto seen = V::not_equal(m_new, minus_inf);
      F correction = V::select(seen, one, exp<V>(V::sub(m_old, m_new)));
      F sum = V::zero();
      for (int j = 0; j < L; ++j) {
        F pj = V::zero_unless(V::both(in_block(j), seen), exp<V>(V::sub(s[j], m_new)));
        sum = V::add(sum, pj);
        if constexpr (Load::kFactors) pj = V::mul(pj, V::load(factors[j]));  // p * V's factor
        V::store(p + L * j, pj);
      }
      V::store(l_lanes, V::fmadd(V::load(l_lanes), correction, sum));
      V::store(m_lanes, m_new);
      V::store(corr, correction);
      for (int64_t t = 0; t < used; ++t) {
        m[i0 + t] = m_lanes[t], l[i0 + t] = l_lanes[t];
        if (corr[t] != 1.0f)
#pragma GCC unroll 16
          for (int c = 0; c < NV; ++c) {
            float* a = acc + (i0 + t) * kHeadDim + L * c;
            V::store(a, V::mul(V::load(a), V::set1(corr[t])));
          }
      }

      // acc_t += p_tj v_j, head by head from cache, up to V::kPvRows rows at a time.
      for (int64_t hh = 0; hh < heads; ++hh) {
        const auto* vh = v + j0 * ldkv + (h0 + hh) * kHeadDim;
        for (int r = 0; r < ROWS;) {
          const int64_t t = hh * ROWS + r;
          RowFetch* fetch = r == 0 ? &next_k : nullptr;  // one fetch per head
          float* rows_acc = acc + (i0 + t) * kHeadDim;
          if constexpr (V::kPvRows >= 4 && ROWS >= 4) {
            add_pv<V, D, 4, NV>(p + t, count, vh, ldkv, rows_acc, fetch);
            r += 4;
          } else if constexpr (V::kPvRows >= 2 && ROWS >= 2) {
            add_pv<V, D, 2, NV>(p + t, count, vh, ldkv, rows_acc, fetch);
            r += 2;
          } else {
            add_pv<V, D, 1, NV>(p + t, count, vh, ldkv, rows_acc, fetch);
            r += 1;
          }
        }
      }
    }
  }
}

// attention_block_all_heads for the shapes qwen3_decode_shapes() accepts.
template <class V, KvDtype D>
void attention_block_all_heads(const float* q, int64_t ldq, int64_t n_kv_heads, int64_t group,
                               int64_t rows, int64_t first_end, const void* k, const void* v,
                               const float* k_factors, const float* v_factors, int64_t ldkv,
                               int64_t p0, int64_t p1, int64_t head_dim, float scale, float* m,
                               float* l, float* acc, float* s) {
  constexpr int N64 = 64 / V::kLanes, N128 = 128 / V::kLanes, N256 = 256 / V::kLanes;
  auto run = head_dim == 256
                 ? (rows == 1 ? all_heads<V, D, N256, 1> : rows == 2 ? all_heads<V, D, N256, 2>
                    : rows == 4 ? all_heads<V, D, N256, 4> : all_heads<V, D, N256, 8>)
             : head_dim == 128
                 ? (rows == 1 ? all_heads<V, D, N128, 1> : rows == 2 ? all_heads<V, D, N128, 2>
                    : rows == 4 ? all_heads<V, D, N128, 4> : all_heads<V, D, N128, 8>)
                 : (rows == 1 ? all_heads<V, D, N64, 1> : rows == 2 ? all_heads<V, D, N64, 2>
                    : rows == 4 ? all_heads<V, D, N64, 4> : all_heads<V, D, N64, 8>);
  return run(q, ldq, n_kv_heads, group, first_end, k, v, k_factors, v_factors, ldkv, p0, p1, scale,
             m, l, acc, s);
}

}  // namespace ellm::simd
