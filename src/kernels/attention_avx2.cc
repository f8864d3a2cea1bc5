// AVX2 flash-attention step (contract in isa_kernels.h) as small GEMMs, like the AVX-512 one:
// the K block is transposed into the scratch ([head_dim][positions]), scores for 4 query rows x
// 16 positions are 8 register accumulators fed by one broadcast q element per FMA row, then per
// row the online-softmax update and O += P.V, 16 output dimensions at a time. head_dim not a
// multiple of 8 goes to the scalar twin.
#include <algorithm>
#include <cmath>

#include "kernels/isa_kernels.h"
#include "kernels/vector_math_avx2.h"

namespace ellm::avx2 {
namespace {

constexpr int kRows = 4;               // query rows per micro-tile
constexpr int64_t kMaxPositions = 16;  // positions per sub-block (2 vectors of scores)

// dst[i * ldd + j] = src[j * lds + i] for an 8 x 8 tile.
void transpose8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
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
// the block after meanwhile (positions are pages apart: see attention_avx512.cc).
void transpose_block(const float* k, int64_t ldk, int64_t width, int64_t head_dim, float* kt,
                     int64_t ldt) {
  int64_t full_j = width / 8 * 8;
  const float* next = k + width * ldk;
  for (int64_t j = 0; j < full_j; j += 8)
    for (int64_t d = 0; d < head_dim; d += 8) {
      if (d % 16 == 0)
        for (int64_t r = 0; r < 8; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(next + (j + r) * ldk + d), _MM_HINT_T0);
      transpose8(k + j * ldk + d, ldk, kt + d * ldt + j, ldt);
    }
  for (int64_t d = 0; d < head_dim; ++d) {
    for (int64_t j = full_j; j < width; ++j) kt[d * ldt + j] = k[j * ldk + d];
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
  float correction = std::exp(m - new_max);  // 0 on the first block (m = -inf)
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
                const float* v, int64_t ldv, int64_t count, int64_t head_dim,
                const float* next_v) {
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
      const float* vj = v + j * ldv + d0;
      if (next_v) _mm_prefetch(reinterpret_cast<const char*>(next_v + j * ldv + d0), _MM_HINT_T0);
      __m256 v0 = _mm256_loadu_ps(vj);
      __m256 v1 = lanes == 2 ? _mm256_loadu_ps(vj + 8) : _mm256_setzero_ps();
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
               const float* k, const float* v, int64_t ldkv, int64_t p0, int64_t p1,
                     int64_t head_dim,
               float scale, float* m, float* l, float* acc, float* scratch) {
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

}  // namespace

void attention_block(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
                     const float* k, const float* v, int64_t ldkv, int64_t p0, int64_t p1,
                     int64_t head_dim,
                     float scale, float* m, float* l, float* acc, float* s) {
  if (head_dim % 8)
    return scalar::attention_block(q, ldq, group, rows, first_end, k, v, ldkv, p0, p1, head_dim, scale,
                                   m, l, acc, s);
  for (int64_t p = p0; p < p1; p += kMaxPositions)
    sub_block(q, ldq, group, rows, first_end, k, v, ldkv, p, std::min(p1, p + kMaxPositions), head_dim,
              scale, m, l, acc, s);
}

}  // namespace ellm::avx2
