// AVX-512 flash attention (contracts in isa_kernels.h). attention_block_all_heads serves decode:
// few query rows, every KV head, K and V read in memory order. attention_block serves prefill
// as small GEMMs: the K block is transposed once into the scratch ([head_dim][positions]), so
// scores for 4 query rows x up to 64 positions are 16 register accumulators fed by one broadcast
// q element per FMA row, with no horizontal reduction per (row, position). Then per row the
// online-softmax update, and O += P.V for the same 4 rows, 64 output dimensions at a time.
#include <algorithm>
#include <cmath>

#include "kernels/isa_kernels.h"
#include "kernels/row_fetch.h"
#include "kernels/vector_math_avx512.h"

namespace ellm::avx512 {
namespace {

constexpr int kRows = 4;  // query rows per micro-tile; 2 when a block has only 2 rows (decode, group 2)
constexpr int64_t kMaxPositions = 64;  // positions per sub-block (4 vectors of scores)

inline __m512 unpacklo_pd(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}
inline __m512 unpackhi_pd(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}

// dst[i * ldd + j] = src[j * lds + i] for a 16 x 16 tile.
void transpose16(const f16* src, int64_t lds, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = load_f16x16(src + i * lds);
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: a0 b0 a1 b1 | a2 b2 a3 b3
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + c] lane L: column 4L + c of source rows i..i+3
    r[i] = unpacklo_pd(t[i], t[i + 2]);
    r[i + 1] = unpackhi_pd(t[i], t[i + 2]);
    r[i + 2] = unpacklo_pd(t[i + 1], t[i + 3]);
    r[i + 3] = unpackhi_pd(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // gather lane L of r[c], r[4 + c], r[8 + c], r[12 + c]
    __m512 even_lo = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    __m512 odd_lo = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
    __m512 even_hi = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    __m512 odd_hi = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    _mm512_storeu_ps(dst + c * ldd, _mm512_shuffle_f32x4(even_lo, even_hi, 0x88));
    _mm512_storeu_ps(dst + (4 + c) * ldd, _mm512_shuffle_f32x4(odd_lo, odd_hi, 0x88));
    _mm512_storeu_ps(dst + (8 + c) * ldd, _mm512_shuffle_f32x4(even_lo, even_hi, 0xDD));
    _mm512_storeu_ps(dst + (12 + c) * ldd, _mm512_shuffle_f32x4(odd_lo, odd_hi, 0xDD));
  }
}

// Prefill fetches K and V rows into L2 kAheadPositions before use. Positions are a whole cache
// row apart (all KV heads, 2 KiB for Qwen3-0.6B), and one head reads a few lines of each: the
// hardware prefetchers see no stream in that. The distance keeps what is in flight (K and V of
// all heads: 2 x 32 x 2 KiB for Qwen3-0.6B) well inside L2.
constexpr int64_t kAheadPositions = 32;

// The cache lines of rows [0, rows) x [d, d + 16) from `ahead`.
inline void prefetch_rows(const f16* ahead, int64_t ld, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r)
    _mm_prefetch(reinterpret_cast<const char*>(ahead + r * ld), _MM_HINT_T1);
}

// kt[d][j] = k[j * ldk + d] for j < width, zero for width <= j < ldt; fetches the rows
// kAheadPositions further on meanwhile.
void transpose_block(const f16* k, int64_t ldk, int64_t width, int64_t head_dim, float* kt,
                     int64_t ldt) {
  int64_t full_j = width / 16 * 16, full_d = head_dim / 16 * 16;
  const f16* ahead = k + kAheadPositions * ldk;
  for (int64_t j = 0; j < full_j; j += 16)
    for (int64_t d = 0; d < full_d; d += 16) {
      prefetch_rows(ahead + j * ldk + d, ldk, 16);
      transpose16(k + j * ldk + d, ldk, kt + d * ldt + j, ldt);
    }
  for (int64_t d = 0; d < head_dim; ++d) {
    for (int64_t j = d < full_d ? full_j : 0; j < width; ++j) kt[d * ldt + j] = f16_to_f32(k[j * ldk + d]);
    for (int64_t j = width; j < ldt; ++j) kt[d * ldt + j] = 0.0f;
  }
}

// s[i][0:16 V] = scale * q_i . kt for R rows.
template <int R, int V>
void scores(const float* const* q, const float* kt, int64_t ldt, int64_t head_dim, float scale,
            float* s) {
  __m512 c[R][V];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int t = 0; t < V; ++t) c[i][t] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; ++d) {
    __m512 kv[V];
#pragma GCC unroll 4
    for (int t = 0; t < V; ++t) kv[t] = _mm512_loadu_ps(kt + d * ldt + 16 * t);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      __m512 qb = _mm512_set1_ps(q[i][d]);
#pragma GCC unroll 4
      for (int t = 0; t < V; ++t) c[i][t] = _mm512_fmadd_ps(qb, kv[t], c[i][t]);
    }
  }
  __m512 vscale = _mm512_set1_ps(scale);
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int t = 0; t < V; ++t) _mm512_storeu_ps(s + i * ldt + 16 * t, _mm512_mul_ps(c[i][t], vscale));
}

// Lane j = the sum of the 16 floats of v[j]: a transpose folded into an add tree.
inline __m512 sum_lanes16(const __m512* v) {
  __m512 pairs[8], quads[4];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: partial sums of v[2i], v[2i+1], v[2i], v[2i+1]
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: partial sums of v[4i .. 4i+3]
    quads[i] = _mm512_add_ps(unpacklo_pd(pairs[2 * i], pairs[2 * i + 1]),
                             unpackhi_pd(pairs[2 * i], pairs[2 * i + 1]));
  // Add the four 128-bit lanes of each quad; quad i lands in lane i.
  __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88),
                             _mm512_shuffle_f32x4(quads[0], quads[1], 0xDD));
  __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88),
                             _mm512_shuffle_f32x4(quads[2], quads[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xDD));
}

// Online-softmax update of one row: s[0:ldt] scores in, probabilities out (zero past
// `visible`); returns the factor the row's accumulated output must be scaled by.
float softmax_row(float* s, int64_t visible, int64_t ldt, float& m, float& l) {
  if (visible <= 0) {
    for (int64_t j = 0; j < ldt; j += 16) _mm512_storeu_ps(s + j, _mm512_setzero_ps());
    return 1.0f;
  }
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < visible; j += 16)
    vmax = _mm512_mask_max_ps(vmax, tail_mask(visible - j), vmax, _mm512_loadu_ps(s + j));
  float new_max = std::max(m, _mm512_reduce_max_ps(vmax));
  // 0 on the first block (m = -inf); 1, without an exp, when the maximum did not move
  float correction = new_max == m ? 1.0f : std::exp(m - new_max);
  __m512 vsum = _mm512_setzero_ps(), vnew_max = _mm512_set1_ps(new_max);
  for (int64_t j = 0; j < ldt; j += 16) {
    __mmask16 mask = j < visible ? tail_mask(visible - j) : 0;
    __m512 p = _mm512_maskz_mov_ps(mask, exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), vnew_max)));
    vsum = _mm512_add_ps(vsum, p);
    _mm512_storeu_ps(s + j, p);
  }
  l = l * correction + _mm512_reduce_add_ps(vsum);
  m = new_max;
  return correction;
}

// acc_i = acc_i * correction_i + p_i . v[0:count] for R rows; rows with a null acc are
// computed but not stored. With ahead_v (v + kAheadPositions rows), fetches those rows meanwhile.
template <int R>
void accumulate(float* const* acc, const float* correction, const float* p, int64_t ldp,
                const f16* v, int64_t ldv, int64_t count, int64_t head_dim,
                const f16* ahead_v) {
  for (int64_t d0 = 0; d0 < head_dim; d0 += 64) {
    __mmask16 mask[4];
    __m512 a[R][4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) mask[t] = d0 + 16 * t < head_dim ? tail_mask(head_dim - d0 - 16 * t) : 0;
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      __m512 c = _mm512_set1_ps(correction[i]);
      const float* src = acc[i] ? acc[i] : acc[0];
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t)
        a[i][t] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask[t], src + d0 + 16 * t), c);
    }
    for (int64_t j = 0; j < count; ++j) {
      const f16* vj = v + j * ldv + d0;
      if (ahead_v)  // one cache line per 32 FP16
        for (int64_t t = 0; t < 4 && d0 + 16 * t < head_dim; t += 2)
          _mm_prefetch(reinterpret_cast<const char*>(ahead_v + j * ldv + d0 + 16 * t), _MM_HINT_T1);
      __m512 vv[4];
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) vv[t] = maskz_load_f16x16(mask[t], vj + 16 * t);
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        __m512 pb = _mm512_set1_ps(p[i * ldp + j]);
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) a[i][t] = _mm512_fmadd_ps(pb, vv[t], a[i][t]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
      if (acc[i])
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) _mm512_mask_storeu_ps(acc[i] + d0 + 16 * t, mask[t], a[i][t]);
  }
}

template <int R>
void sub_block(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
               const f16* k, const f16* v, int64_t ldkv, int64_t p0, int64_t p1,
               int64_t head_dim, float scale, float* m, float* l, float* acc, float* scratch) {
  int64_t width = p1 - p0, vecs = (width + 15) / 16, ldt = vecs * 16;
  float* kt = scratch;                // [head_dim][ldt]
  float* s = kt + head_dim * ldt;     // [R][ldt]
  transpose_block(k + p0 * ldkv, ldkv, width, head_dim, kt, ldt);
  for (int64_t r0 = 0; r0 < rows; r0 += R) {
    // Positions the tile's last row sees; rows before the first visible position skip the block.
    int64_t last = std::min(rows, r0 + R) - 1;
    int64_t tile_visible = std::min(p1, first_end + last / group) - p0;
    if (tile_visible <= 0) continue;
    const float* qr[R];
    float* acc_rows[R];
    for (int i = 0; i < R; ++i) {
      int64_t r = std::min(r0 + i, last);
      qr[i] = q + (r / group) * ldq + (r % group) * head_dim;
      acc_rows[i] = r0 + i <= last ? acc + r * head_dim : nullptr;
    }
    int64_t tile_vecs = (tile_visible + 15) / 16;
    switch (tile_vecs) {
      case 1: scores<R, 1>(qr, kt, ldt, head_dim, scale, s); break;
      case 2: scores<R, 2>(qr, kt, ldt, head_dim, scale, s); break;
      case 3: scores<R, 3>(qr, kt, ldt, head_dim, scale, s); break;
      default: scores<R, 4>(qr, kt, ldt, head_dim, scale, s); break;
    }
    float correction[R];
    for (float& c : correction) c = 1.0f;
    for (int i = 0; i < R && r0 + i <= last; ++i) {
      int64_t r = r0 + i;
      int64_t visible = std::min(p1, first_end + r / group) - p0;
      correction[i] = softmax_row(s + i * ldt, visible, tile_vecs * 16, m[r], l[r]);
    }
    accumulate<R>(acc_rows, correction, s, ldt, v + p0 * ldkv, ldkv, tile_visible, head_dim,
               r0 == 0 ? v + (p0 + kAheadPositions) * ldkv : nullptr);
  }
}

// acc[r] += sum_j p[j * 16 + r] v_j for R rows of one head (16 * V dims), j < count. With
// `fetch`, fetches V / 2 of its lines per position as it goes.
template <int R, int V>
void add_pv(const float* p, int64_t count, const f16* v, int64_t ldv, float* acc, RowFetch* fetch) {
  __m512 a[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < V; ++c) a[r][c] = _mm512_loadu_ps(acc + r * 16 * V + 16 * c);
  for (int64_t j = 0; j < count; ++j) {
    __m512 pj[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) pj[r] = _mm512_set1_ps(p[j * 16 + r]);
    if (fetch) fetch->step<V / 2>();
#pragma GCC unroll 16
    for (int c = 0; c < V; ++c) {
      __m512 vc = load_f16x16(v + j * ldv + 16 * c);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) a[r][c] = _mm512_fmadd_ps(pj[r], vc, a[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < V; ++c) _mm512_storeu_ps(acc + r * 16 * V + 16 * c, a[r][c]);
}

// dots[j][lane0 + r] = 16 partial sums of q_r . k_{p0 + j} for ROWS rows of one KV head and
// 16 / ROWS positions (positions past `last` repeat it; the caller masks them). q[r] points at
// row r's query, k at position 0 of the head. 16 accumulators in registers. Fetches 8 / ROWS of
// `fetch`'s lines per 16 dimensions as it goes.
template <int V, int ROWS>
inline void dot_block(const float* const* q, const f16* k, int64_t ldk, int64_t p0, int64_t last,
                      __m512 (*dots)[16], int lane0, RowFetch& fetch) {
  constexpr int kPositions = 16 / ROWS;
  const f16* kj[kPositions];
#pragma GCC unroll 16
  for (int j = 0; j < kPositions; ++j) kj[j] = k + std::min<int64_t>(p0 + j, last) * ldk;
  __m512 a[kPositions][ROWS];
#pragma GCC unroll 16
  for (int j = 0; j < kPositions; ++j)
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) a[j][r] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int c = 0; c < V; ++c) {
    __m512 qc[ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) qc[r] = _mm512_loadu_ps(q[r] + 16 * c);
    fetch.step<8 / ROWS>();
#pragma GCC unroll 16
    for (int j = 0; j < kPositions; ++j) {
      __m512 kc = load_f16x16(kj[j] + 16 * c);
#pragma GCC unroll 8
      for (int r = 0; r < ROWS; ++r) a[j][r] = _mm512_fmadd_ps(kc, qc[r], a[j][r]);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < kPositions; ++j)
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) dots[j][lane0 + r] = a[j][r];
}

// attention_block_all_heads for head_dim = 16 * V and ROWS query rows per KV head, 16 positions
// at a time. The (KV head, row) pairs go 16 at a time as the lanes of a vector (kHeads heads of
// ROWS rows): the K pass gives, per position, the 16 pairs' scores as one vector (dot_block,
// then one add tree), the online softmax is lane-wise over positions, and P.V goes head by head
// from cache (its V lines were fetched during the K pass).
template <int V, int ROWS>
void all_heads(const float* q, int64_t ldq, int64_t n_kv_heads, int64_t group,
                     int64_t first_end, const f16* k, const f16* v, int64_t ldkv, int64_t p0,
                     int64_t p1, float scale, float* m, float* l, float* acc, float* scratch) {
  constexpr int64_t kHeadDim = 16 * V;
  constexpr int kHeads = 16 / ROWS;
  constexpr int kBlockPositions = 16 / ROWS;
  float* p = scratch;  // [16 positions][16 lanes] probabilities
  // [position][lane]: 16 partial sums of the lane's dot product. Lanes past the last head keep
  // zeros or an earlier group's finite values; the lane masks below drop them.
  __m512 dots[16][16] = {};
  const __m512 vscale = _mm512_set1_ps(scale), minus_inf = _mm512_set1_ps(-INFINITY);
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t j0 = p0; j0 < p1; j0 += 16) {
    const int64_t count = std::min<int64_t>(16, p1 - j0);
    for (int64_t h0 = 0; h0 < n_kv_heads; h0 += kHeads) {
      const int64_t heads = std::min<int64_t>(kHeads, n_kv_heads - h0);
      const __mmask16 lanes = tail_mask(heads * ROWS);
      const float* qr[16];  // lane t: head h0 + t / ROWS (the last one again past the end), row t % ROWS
      alignas(64) int32_t visible[16];  // positions of the block lane t may see
      for (int t = 0; t < 16; ++t) {
        int64_t h = h0 + std::min<int64_t>(t / ROWS, heads - 1), r = t % ROWS;
        qr[t] = q + (r / group) * ldq + (h * group + r % group) * kHeadDim;
        visible[t] = int32_t(std::clamp<int64_t>(first_end + r / group - j0, 0, count));
      }
      const __m512i vis = _mm512_load_si512(visible);

      // s[j] lane t = scale * q_t . k_j. dots[j][t] holds the dot product as 16 partial sums,
      // computed by register blocks of 16 / ROWS positions x ROWS rows of one head: each K chunk
      // is converted once and serves every row, each q chunk is loaded once per block.
      // Memory streams while the compute runs: the K pass fetches this block's V, P.V the next
      // block's K, each in memory order, a few lines per step: half a block ahead. A whole block
      // ahead ran 5-10% slower at 32k; likely because a block's K and V (64 KiB for Qwen3-0.6B)
      // overflow L1, so fetched lines left it before use.
      const int64_t next = std::min<int64_t>(16, p1 - j0 - 16);
      RowFetch this_v(v + h0 * kHeadDim, j0, count, ldkv, heads * kHeadDim);
      RowFetch next_k(k + h0 * kHeadDim, j0 + 16, next, ldkv, heads * kHeadDim);
      for (int hh = 0; hh < heads; ++hh)
        for (int jb = 0; jb < 16; jb += kBlockPositions)
          dot_block<V, ROWS>(qr + hh * ROWS, k + (h0 + hh) * kHeadDim, ldkv, j0 + jb,
                             j0 + count - 1, dots + jb, hh * ROWS, this_v);
      __m512 s[16];
      for (int j = 0; j < 16; ++j) s[j] = _mm512_mul_ps(sum_lanes16(dots[j]), vscale);

      // Online softmax, lane-wise. A lane that has seen no position keeps m = -inf, correction 1.
      const int64_t i0 = h0 * ROWS;
      __m512 m_old = _mm512_mask_loadu_ps(minus_inf, lanes, m + i0);
      __m512 m_new = m_old;
      for (int j = 0; j < 16; ++j) {
        __mmask16 in = _mm512_cmpgt_epi32_mask(vis, _mm512_set1_epi32(j));
        m_new = _mm512_mask_max_ps(m_new, in, m_new, s[j]);
      }
      __mmask16 seen = _mm512_cmp_ps_mask(m_new, minus_inf, _CMP_NEQ_OQ);
      __m512 correction = _mm512_mask_blend_ps(seen, one, exp_ps(_mm512_sub_ps(m_old, m_new)));
      __m512 sum = _mm512_setzero_ps();
      for (int j = 0; j < 16; ++j) {
        __mmask16 in = _mm512_cmpgt_epi32_mask(vis, _mm512_set1_epi32(j)) & seen;
        __m512 pj = _mm512_maskz_mov_ps(in, exp_ps(_mm512_sub_ps(s[j], m_new)));
        sum = _mm512_add_ps(sum, pj);
        _mm512_storeu_ps(p + 16 * j, pj);
      }
      __m512 l_new = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lanes, l + i0), correction, sum);
      _mm512_mask_storeu_ps(l + i0, lanes, l_new);
      _mm512_mask_storeu_ps(m + i0, lanes, m_new);
      alignas(64) float corr[16];
      _mm512_store_ps(corr, correction);
      for (int64_t t = 0; t < heads * ROWS; ++t)
        if (corr[t] != 1.0f)
#pragma GCC unroll 16
          for (int c = 0; c < V; ++c) {
            float* a = acc + (i0 + t) * kHeadDim + 16 * c;
            _mm512_storeu_ps(a, _mm512_mul_ps(_mm512_loadu_ps(a), _mm512_set1_ps(corr[t])));
          }

      // acc_t += p_tj v_j, head by head from cache, two rows at a time.
      for (int64_t hh = 0; hh < heads; ++hh) {
        const f16* vh = v + j0 * ldkv + (h0 + hh) * kHeadDim;
        for (int r = 0; r < ROWS; r += 2) {
          int64_t t = hh * ROWS + r;
          RowFetch* fetch = r == 0 ? &next_k : nullptr;  // one fetch per head
          if (r + 1 < ROWS)
            add_pv<2, V>(p + t, count, vh, ldkv, acc + (i0 + t) * kHeadDim, fetch);
          else
            add_pv<1, V>(p + t, count, vh, ldkv, acc + (i0 + t) * kHeadDim, fetch);
        }
      }
    }
  }
}

}  // namespace

void attention_block_all_heads(const float* q, int64_t ldq, int64_t n_kv_heads, int64_t group,
                               int64_t rows, int64_t first_end, const f16* k, const f16* v,
                               int64_t ldkv, int64_t p0, int64_t p1, int64_t head_dim, float scale,
                               float* m, float* l, float* acc, float* s) {
  // The driver calls it for head_dim 64 or 128 and rows 1, 2, 4 or 8 only.
  auto run = head_dim == 128
                 ? (rows == 1 ? all_heads<8, 1> : rows == 2 ? all_heads<8, 2> : rows == 4 ? all_heads<8, 4> : all_heads<8, 8>)
                 : (rows == 1 ? all_heads<4, 1> : rows == 2 ? all_heads<4, 2> : rows == 4 ? all_heads<4, 4> : all_heads<4, 8>);
  return run(q, ldq, n_kv_heads, group, first_end, k, v, ldkv, p0, p1, scale, m, l, acc, s);
}

void attention_block(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
                     const f16* k, const f16* v, int64_t ldkv, int64_t p0, int64_t p1,
                     int64_t head_dim, float scale, float* m, float* l, float* acc, float* s) {
  auto run = rows <= 2 ? sub_block<2> : sub_block<kRows>;
  for (int64_t p = p0; p < p1; p += kMaxPositions)
    run(q, ldq, group, rows, first_end, k, v, ldkv, p, std::min(p1, p + kMaxPositions), head_dim,
        scale, m, l, acc, s);
}

}  // namespace ellm::avx512
