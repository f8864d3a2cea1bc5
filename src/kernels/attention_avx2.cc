// AVX2 flash attention (contracts in isa_kernels.h), the AVX-512 design in 8 lanes. Prefill
// (attention_block) as small GEMMs: the K block is transposed into the scratch ([head_dim]
// [positions]), scores for 4 query rows x 16 positions are 8 register accumulators fed by one
// broadcast q element per FMA row, then per row the online-softmax update and O += P.V, 16
// output dimensions at a time; head_dim not a multiple of 8 goes to the scalar twin. Decode
// (attention_block_all_heads): 8 (KV head, row) pairs as the lanes of a vector, K and V rows
// read in memory order.
#include <algorithm>
#include <cmath>

#include "kernels/isa_kernels.h"
#include "kernels/row_fetch.h"
#include "kernels/vector_math_avx2.h"

namespace ellm::avx2 {
namespace {

constexpr int kRows = 4;               // query rows per micro-tile
constexpr int64_t kMaxPositions = 16;  // positions per sub-block (2 vectors of scores)

// dst[i * ldd + j] = src[j * lds + i] for an 8 x 8 tile.
void transpose8(const f16* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = load_f16x8(src + i * lds);
  for (int i = 0; i < 8; i += 2) {  // per 128-bit lane: a0 b0 a1 b1 | a2 b2 a3 b3
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // r[i + c] lane L: column 4L + c of source rows i..i+3
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(dst + c * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
    _mm256_storeu_ps(dst + (4 + c) * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
  }
}

// kt[d][j] = k[j * ldk + d] for j < width, zero for width <= j < ldt; fetches the same rows of
// the block after meanwhile (positions are whole cache rows apart: see attention_avx512.cc).
void transpose_block(const f16* k, int64_t ldk, int64_t width, int64_t head_dim, float* kt,
                     int64_t ldt) {
  int64_t full_j = width / 8 * 8;
  const f16* next = k + width * ldk;
  for (int64_t j = 0; j < full_j; j += 8)
    for (int64_t d = 0; d < head_dim; d += 8) {
      if (d % 32 == 0)  // one cache line per 32 FP16
        for (int64_t r = 0; r < 8; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(next + (j + r) * ldk + d), _MM_HINT_T0);
      transpose8(k + j * ldk + d, ldk, kt + d * ldt + j, ldt);
    }
  for (int64_t d = 0; d < head_dim; ++d) {
    for (int64_t j = full_j; j < width; ++j) kt[d * ldt + j] = f16_to_f32(k[j * ldk + d]);
    for (int64_t j = width; j < ldt; ++j) kt[d * ldt + j] = 0.0f;
  }
}

// s[i][0:8 V] = scale * q_i . kt for kRows rows.
template <int V>
void scores(const float* const* q, const float* kt, int64_t ldt, int64_t head_dim, float scale,
            float* s) {
  __m256 c[kRows][V];
#pragma GCC unroll 4
  for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 2
    for (int t = 0; t < V; ++t) c[i][t] = _mm256_setzero_ps();
  for (int64_t d = 0; d < head_dim; ++d) {
    __m256 kv[V];
#pragma GCC unroll 2
    for (int t = 0; t < V; ++t) kv[t] = _mm256_loadu_ps(kt + d * ldt + 8 * t);
#pragma GCC unroll 4
    for (int i = 0; i < kRows; ++i) {
      __m256 qb = _mm256_broadcast_ss(q[i] + d);
#pragma GCC unroll 2
      for (int t = 0; t < V; ++t) c[i][t] = _mm256_fmadd_ps(qb, kv[t], c[i][t]);
    }
  }
  __m256 vscale = _mm256_set1_ps(scale);
#pragma GCC unroll 4
  for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 2
    for (int t = 0; t < V; ++t) _mm256_storeu_ps(s + i * ldt + 8 * t, _mm256_mul_ps(c[i][t], vscale));
}

// Lanes j + 0..7 that are < visible.
inline __m256 visible_lanes(int64_t j, int64_t visible) {
  __m256 index = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmp_ps(index, _mm256_set1_ps(float(visible - j)), _CMP_LT_OQ);
}

// Online-softmax update of one row: s[0:ldt] scores in, probabilities out (zero past
// `visible`); returns the factor the row's accumulated output must be scaled by.
float softmax_row(float* s, int64_t visible, int64_t ldt, float& m, float& l) {
  if (visible <= 0) {
    for (int64_t j = 0; j < ldt; j += 8) _mm256_storeu_ps(s + j, _mm256_setzero_ps());
    return 1.0f;
  }
  float block_max = -INFINITY;
  for (int64_t j = 0; j < visible; ++j) block_max = std::max(block_max, s[j]);
  float new_max = std::max(m, block_max);
  // 0 on the first block (m = -inf); 1, without an exp, when the maximum did not move
  float correction = new_max == m ? 1.0f : std::exp(m - new_max);
  __m256 vsum = _mm256_setzero_ps(), vnew_max = _mm256_set1_ps(new_max);
  for (int64_t j = 0; j < ldt; j += 8) {
    __m256 p = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vnew_max));
    p = _mm256_and_ps(p, visible_lanes(j, visible));
    vsum = _mm256_add_ps(vsum, p);
    _mm256_storeu_ps(s + j, p);
  }
  l = l * correction + hsum(vsum);
  m = new_max;
  return correction;
}

// acc_i = acc_i * correction_i + p_i . v[0:count] for kRows rows, 16 dimensions at a time (8 at
// the end); rows with a null acc are computed but not stored.
void accumulate(float* const* acc, const float* correction, const float* p, int64_t ldp,
                const f16* v, int64_t ldv, int64_t count, int64_t head_dim,
                const f16* next_v) {
  for (int64_t d0 = 0; d0 < head_dim; d0 += 16) {
    int lanes = head_dim - d0 >= 16 ? 2 : 1;
    __m256 a[kRows][2];
#pragma GCC unroll 4
    for (int i = 0; i < kRows; ++i) {
      __m256 c = _mm256_set1_ps(correction[i]);
      const float* src = (acc[i] ? acc[i] : acc[0]) + d0;
      a[i][0] = _mm256_mul_ps(_mm256_loadu_ps(src), c);
      a[i][1] = lanes == 2 ? _mm256_mul_ps(_mm256_loadu_ps(src + 8), c) : _mm256_setzero_ps();
    }
    for (int64_t j = 0; j < count; ++j) {
      const f16* vj = v + j * ldv + d0;
      if (next_v && d0 % 32 == 0) _mm_prefetch(reinterpret_cast<const char*>(next_v + j * ldv + d0), _MM_HINT_T0);
      __m256 v0 = load_f16x8(vj);
      __m256 v1 = lanes == 2 ? load_f16x8(vj + 8) : _mm256_setzero_ps();
#pragma GCC unroll 4
      for (int i = 0; i < kRows; ++i) {
        __m256 pb = _mm256_broadcast_ss(p + i * ldp + j);
        a[i][0] = _mm256_fmadd_ps(pb, v0, a[i][0]);
        a[i][1] = _mm256_fmadd_ps(pb, v1, a[i][1]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < kRows; ++i) {
      if (!acc[i]) continue;
      _mm256_storeu_ps(acc[i] + d0, a[i][0]);
      if (lanes == 2) _mm256_storeu_ps(acc[i] + d0 + 8, a[i][1]);
    }
  }
}

void sub_block(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
               const f16* k, const f16* v, int64_t ldkv, int64_t p0, int64_t p1,
               int64_t head_dim, float scale, float* m, float* l, float* acc, float* scratch) {
  int64_t width = p1 - p0, ldt = (width + 7) / 8 * 8;
  float* kt = scratch;             // [head_dim][ldt]
  float* s = kt + head_dim * ldt;  // [kRows][ldt]
  transpose_block(k + p0 * ldkv, ldkv, width, head_dim, kt, ldt);
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    // Positions the tile's last row sees; rows before the first visible position skip the block.
    int64_t last = std::min(rows, r0 + kRows) - 1;
    int64_t tile_visible = std::min(p1, first_end + last / group) - p0;
    if (tile_visible <= 0) continue;
    const float* qr[kRows];
    float* acc_rows[kRows];
    for (int i = 0; i < kRows; ++i) {
      int64_t r = std::min(r0 + i, last);
      qr[i] = q + (r / group) * ldq + (r % group) * head_dim;
      acc_rows[i] = r0 + i <= last ? acc + r * head_dim : nullptr;
    }
    int64_t tile_width = (tile_visible + 7) / 8 * 8;
    if (tile_width == 8)
      scores<1>(qr, kt, ldt, head_dim, scale, s);
    else
      scores<2>(qr, kt, ldt, head_dim, scale, s);
    float correction[kRows] = {1, 1, 1, 1};
    for (int i = 0; i < kRows && r0 + i <= last; ++i) {
      int64_t r = r0 + i;
      int64_t visible = std::min(p1, first_end + r / group) - p0;
      correction[i] = softmax_row(s + i * ldt, visible, tile_width, m[r], l[r]);
    }
    accumulate(acc_rows, correction, s, ldt, v + p0 * ldkv, ldkv, tile_visible, head_dim,
               r0 == 0 ? v + p1 * ldkv : nullptr);
  }
}


// ---- decode: every KV head, K and V in memory order (see the AVX-512 twin) ----

// Lane j = the sum of the 8 floats of v[j].
inline __m256 sum_lanes8(const __m256* v) {
  __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
  __m256 c = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
  __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);  // per 128-bit half: v0..v3, v4..v7
  return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}

// acc += sum_j p[j * 8] v_j for one row of one head (8 * V dims), 8 vectors of dims at a time.
// With `fetch`, fetches 2 of its lines per position and 64 dims as it goes.
template <int V>
void add_pv_row(const float* p, int64_t count, const f16* v, int64_t ldv, float* acc, RowFetch* fetch) {
  for (int half = 0; half < V; half += 8) {
    __m256 a[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) a[c] = _mm256_loadu_ps(acc + 8 * (half + c));
    for (int64_t j = 0; j < count; ++j) {
      __m256 pj = _mm256_set1_ps(p[j * 8]);
      if (fetch) fetch->step<2>();
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) a[c] = _mm256_fmadd_ps(pj, load_f16x8(v + j * ldv + 8 * (half + c)), a[c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(acc + 8 * (half + c), a[c]);
  }
}

// dots[j][lane0 + r] = 8 partial sums of q_r . k_{p0 + j} for ROWS rows of one KV head and
// 8 / ROWS positions (positions past `last` repeat it). 8 accumulators in registers.
// Fetches one of `fetch`'s lines (two for one row) per 8 dims as it goes.
template <int V, int ROWS>
inline void dot_block(const float* const* q, const f16* k, int64_t ldk, int64_t p0, int64_t last,
                      __m256 (*dots)[8], int lane0, RowFetch& fetch) {
  constexpr int kPositions = 8 / ROWS;
  const f16* kj[kPositions];
#pragma GCC unroll 8
  for (int j = 0; j < kPositions; ++j) kj[j] = k + std::min<int64_t>(p0 + j, last) * ldk;
  __m256 a[kPositions][ROWS];
#pragma GCC unroll 8
  for (int j = 0; j < kPositions; ++j)
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) a[j][r] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int c = 0; c < V; ++c) {
    fetch.step<ROWS == 1 ? 2 : 1>();
#pragma GCC unroll 8
    for (int j = 0; j < kPositions; ++j) {
      __m256 kc = load_f16x8(kj[j] + 8 * c);
#pragma GCC unroll 8
      for (int r = 0; r < ROWS; ++r) a[j][r] = _mm256_fmadd_ps(kc, _mm256_loadu_ps(q[r] + 8 * c), a[j][r]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < kPositions; ++j)
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) dots[j][lane0 + r] = a[j][r];
}

// head_dim = 8 * V (V a multiple of 8), ROWS query rows per KV head; the (KV head, row) pairs go
// 8 at a time as the lanes of a vector, 8 positions at a time.
template <int V, int ROWS>
void all_heads(const float* q, int64_t ldq, int64_t n_kv_heads, int64_t group, int64_t first_end,
               const f16* k, const f16* v, int64_t ldkv, int64_t p0, int64_t p1, float scale,
               float* m, float* l, float* acc, float* scratch) {
  constexpr int64_t kHeadDim = 8 * V;
  constexpr int kHeads = 8 / ROWS;
  float* p = scratch;  // [8 positions][8 lanes] probabilities
  // [position][lane]: 8 partial sums of the lane's dot product. Lanes past the last head keep
  // zeros or an earlier group's finite values; they are never read back.
  __m256 dots[8][8] = {};
  const __m256 vscale = _mm256_set1_ps(scale), zero = _mm256_setzero_ps();
  for (int64_t j0 = p0; j0 < p1; j0 += 8) {
    const int64_t count = std::min<int64_t>(8, p1 - j0);
    for (int64_t h0 = 0; h0 < n_kv_heads; h0 += kHeads) {
      const int64_t heads = std::min<int64_t>(kHeads, n_kv_heads - h0), used = heads * ROWS;
      const float* qr[8];  // lane t: head h0 + t / ROWS (the last one again past the end), row t % ROWS
      alignas(32) int32_t visible[8];
      for (int t = 0; t < 8; ++t) {
        int64_t h = h0 + std::min<int64_t>(t / ROWS, heads - 1), r = t % ROWS;
        qr[t] = q + (r / group) * ldq + (h * group + r % group) * kHeadDim;
        visible[t] = int32_t(std::clamp<int64_t>(first_end + r / group - j0, 0, count));
      }
      const __m256i vis = _mm256_load_si256(reinterpret_cast<const __m256i*>(visible));
      auto in_block = [&](int j) { return _mm256_castsi256_ps(_mm256_cmpgt_epi32(vis, _mm256_set1_epi32(j))); };

      // s[j] lane t = scale * q_t . k_j, from dot_block's partial sums. The K pass fetches this
      // block's V, P.V the next block's K (see the AVX-512 twin).
      const int64_t next = std::min<int64_t>(8, p1 - j0 - 8);
      RowFetch this_v(v + h0 * kHeadDim, j0, count, ldkv, heads * kHeadDim);
      RowFetch next_k(k + h0 * kHeadDim, j0 + 8, next, ldkv, heads * kHeadDim);
      for (int64_t hh = 0; hh < heads; ++hh)
        for (int jb = 0; jb < 8; jb += 8 / ROWS)
          dot_block<V, ROWS>(qr + hh * ROWS, k + (h0 + hh) * kHeadDim, ldkv, j0 + jb, j0 + count - 1,
                             dots + jb, int(hh * ROWS), this_v);
      __m256 s[8];
      for (int j = 0; j < 8; ++j) s[j] = _mm256_mul_ps(sum_lanes8(dots[j]), vscale);

      // Online softmax, lane-wise; a lane that has seen no position keeps m = -inf.
      const int64_t i0 = h0 * ROWS;
      alignas(32) float m_lanes[8], l_lanes[8], corr[8];
      for (int t = 0; t < 8; ++t) m_lanes[t] = t < used ? m[i0 + t] : -INFINITY, l_lanes[t] = t < used ? l[i0 + t] : 0.0f;
      __m256 m_old = _mm256_load_ps(m_lanes), m_new = m_old;
      for (int j = 0; j < 8; ++j) m_new = _mm256_blendv_ps(m_new, _mm256_max_ps(m_new, s[j]), in_block(j));
      __m256 seen = _mm256_cmp_ps(m_new, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
      __m256 correction = _mm256_blendv_ps(_mm256_set1_ps(1.0f), exp_ps(_mm256_sub_ps(m_old, m_new)), seen);
      __m256 sum = zero;
      for (int j = 0; j < 8; ++j) {
        __m256 pj = _mm256_and_ps(exp_ps(_mm256_sub_ps(s[j], m_new)), _mm256_and_ps(in_block(j), seen));
        sum = _mm256_add_ps(sum, pj);
        _mm256_storeu_ps(p + 8 * j, pj);
      }
      _mm256_store_ps(l_lanes, _mm256_fmadd_ps(_mm256_load_ps(l_lanes), correction, sum));
      _mm256_store_ps(m_lanes, m_new);
      _mm256_store_ps(corr, correction);
      for (int64_t t = 0; t < used; ++t) {
        m[i0 + t] = m_lanes[t], l[i0 + t] = l_lanes[t];
        if (corr[t] != 1.0f)
          for (int c = 0; c < V; ++c) {
            float* a = acc + (i0 + t) * kHeadDim + 8 * c;
            _mm256_storeu_ps(a, _mm256_mul_ps(_mm256_loadu_ps(a), _mm256_set1_ps(corr[t])));
          }
      }

      for (int64_t t = 0; t < used; ++t)  // acc_t += p_tj v_j, from cache
        add_pv_row<V>(p + t, count, v + j0 * ldkv + (h0 + t / ROWS) * kHeadDim, ldkv, acc + (i0 + t) * kHeadDim,
                      t % ROWS == 0 ? &next_k : nullptr);
    }
  }
}

}  // namespace

void attention_block(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
                     const f16* k, const f16* v, int64_t ldkv, int64_t p0, int64_t p1,
                     int64_t head_dim, float scale, float* m, float* l, float* acc, float* s) {
  if (head_dim % 8)
    return scalar::attention_block(q, ldq, group, rows, first_end, k, v, ldkv, p0, p1, head_dim, scale,
                                   m, l, acc, s);
  for (int64_t p = p0; p < p1; p += kMaxPositions)
    sub_block(q, ldq, group, rows, first_end, k, v, ldkv, p, std::min(p1, p + kMaxPositions), head_dim,
              scale, m, l, acc, s);
}

void attention_block_all_heads(const float* q, int64_t ldq, int64_t n_kv_heads, int64_t group,
                               int64_t rows, int64_t first_end, const f16* k, const f16* v,
                               int64_t ldkv, int64_t p0, int64_t p1, int64_t head_dim, float scale,
                               float* m, float* l, float* acc, float* s) {
  // The driver calls it for head_dim 64 or 128 and rows 1, 2, 4 or 8 only.
  auto run = head_dim == 128
                 ? (rows == 1 ? all_heads<16, 1> : rows == 2 ? all_heads<16, 2> : rows == 4 ? all_heads<16, 4> : all_heads<16, 8>)
                 : (rows == 1 ? all_heads<8, 1> : rows == 2 ? all_heads<8, 2> : rows == 4 ? all_heads<8, 4> : all_heads<8, 8>);
  return run(q, ldq, n_kv_heads, group, first_end, k, v, ldkv, p0, p1, scale, m, l, acc, s);
}

}  // namespace ellm::avx2
