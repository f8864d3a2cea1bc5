// AVX-512-BF16 flash-attention block for prefill over an FP16 cache (contract of attention_block
// in kernel_table.h): S = Q.K^T and O = P.V in vdpbf16ps over the layouts of
// kernels/bf16_attention.h, the online softmax in FP32. A vdpbf16ps lane takes two products at
// once, so a score lane (one position) runs over pairs of dims, and an output lane (one dim) over
// pairs of positions: each a single chain in order, whatever rows or positions share the call.
#include <immintrin.h>

#include <cstring>

#include "kernels/avx512/avx512.h"
#include "kernels/bf16_attention.h"

namespace ellm::avx512 {
namespace {

using namespace bf16_attention;

inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// The BF16 pair at element 2 * pair of a row, broadcast to every lane.
inline __m512i broadcast_pair(const uint16_t* row, int64_t pair) {
  int32_t both;
  std::memcpy(&both, row + 2 * pair, sizeof both);
  return _mm512_set1_epi32(both);
}

// s[r][16 pt, 16 (pt + T)) for R rows from r0: T position tiles from pt on.
template <int R, int T>
void scores(const uint16_t* qb, const uint8_t* kt, int64_t head_dim, int64_t r0, int64_t pt, float* s) {
  __m512 c[R][T];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) c[i][t] = _mm512_setzero_ps();
  for (int64_t ks = 0; ks < head_dim / 32; ++ks) {
    const uint8_t* tile = kt + (ks * kPositionTiles + pt) * 1024;
    for (int64_t pair = 0; pair < 16; ++pair) {
      __m512i kv[T];
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) kv[t] = _mm512_load_si512(tile + t * 1024 + pair * 64);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        const __m512i qv = broadcast_pair(qb + (r0 + i) * head_dim, ks * 16 + pair);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) c[i][t] = dot_pairs(c[i][t], qv, kv[t]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(s + (r0 + i) * kPositions + (pt + t) * 16, c[i][t]);
}

// acc[r][d0, d0 + 16 NV) += P.V for R rows from r0 over `pairs` pairs of positions.
template <int R, int NV>
void add_pv(const uint16_t* pb, const uint16_t* vb, int64_t pairs, int64_t head_dim, int64_t r0,
            int64_t d0, float* acc) {
  __m512 a[R][NV];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int t = 0; t < NV; ++t) a[i][t] = _mm512_loadu_ps(acc + (r0 + i) * head_dim + d0 + 16 * t);
  for (int64_t pair = 0; pair < pairs; ++pair) {
    __m512i vv[NV];
#pragma GCC unroll 8
    for (int t = 0; t < NV; ++t)
      vv[t] = _mm512_loadu_si512(vb + pair * 2 * head_dim + 2 * (d0 + 16 * t));
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512i pp = broadcast_pair(pb + (r0 + i) * kPositions, pair);
#pragma GCC unroll 8
      for (int t = 0; t < NV; ++t) a[i][t] = dot_pairs(a[i][t], pp, vv[t]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int t = 0; t < NV; ++t) _mm512_storeu_ps(acc + (r0 + i) * head_dim + d0 + 16 * t, a[i][t]);
}

// Scores then P.V for R rows from r0 (every row's own chains; R only sets how many share a
// register tile).
template <int R>
void score_rows(const Scratch& w, const uint8_t* kt, int64_t position_tiles, int64_t head_dim, int64_t r0) {
  for (int64_t pt = 0; pt < position_tiles; pt += 4) {
    switch (std::min<int64_t>(4, position_tiles - pt)) {
      case 1: scores<R, 1>(w.qb, kt, head_dim, r0, pt, w.s); break;
      case 2: scores<R, 2>(w.qb, kt, head_dim, r0, pt, w.s); break;
      case 3: scores<R, 3>(w.qb, kt, head_dim, r0, pt, w.s); break;
      default: scores<R, 4>(w.qb, kt, head_dim, r0, pt, w.s); break;
    }
  }
}
template <int R>
void add_pv_rows(const Scratch& w, const uint16_t* vb, int64_t pairs, int64_t head_dim, int64_t r0, float* acc) {
  for (int64_t d0 = 0; d0 < head_dim; d0 += 64) {
    switch (std::min<int64_t>(4, (head_dim - d0) / 16)) {
      case 2: add_pv<R, 2>(w.pb, vb, pairs, head_dim, r0, d0, acc); break;
      default: add_pv<R, 4>(w.pb, vb, pairs, head_dim, r0, d0, acc); break;
    }
  }
}

// One block of at most 128 positions against the packed Q: rows 4 at a time, the last ones 2 and
// 1 at a time, so no row past `rows` is read or written in acc (in a several-heads item those are
// the next head's).
void block(const Scratch& w, const uint8_t* kt, const uint16_t* vb, int64_t group, int64_t rows,
           int64_t first_end, int64_t p0, int64_t p1, int64_t head_dim, float* m, float* l,
           float* acc) {
  const int64_t width = p1 - p0, position_tiles = (width + 15) / 16;
  const int64_t fours = rows / 4 * 4, twos = fours + (rows - fours) / 2 * 2;
  for (int64_t r0 = 0; r0 < fours; r0 += 4) score_rows<4>(w, kt, position_tiles, head_dim, r0);
  for (int64_t r0 = fours; r0 < twos; r0 += 2) score_rows<2>(w, kt, position_tiles, head_dim, r0);
  if (twos < rows) score_rows<1>(w, kt, position_tiles, head_dim, twos);

  float correction[kRows];
  softmax_rows(w, group, rows, first_end, p0, p1, m, l, correction);
  rescale_rows(correction, rows, head_dim, acc);

  const int64_t pairs = (width + 1) / 2;  // past `width`, V and the probabilities are zero
  for (int64_t r0 = 0; r0 < fours; r0 += 4) add_pv_rows<4>(w, vb, pairs, head_dim, r0, acc);
  for (int64_t r0 = fours; r0 < twos; r0 += 2) add_pv_rows<2>(w, vb, pairs, head_dim, r0, acc);
  if (twos < rows) add_pv_rows<1>(w, vb, pairs, head_dim, twos, acc);
}

}  // namespace

size_t bf16_attention_scratch_floats(int64_t head_dim) { return bf16_attention::scratch_floats(head_dim); }

void forget_bf16_attention_scratch(float* s) { bf16_attention::clear_cache(s); }

void attention_block_bf16_products(const float* q, int64_t ldq, int64_t group, int64_t rows,
                                   int64_t first_end, const void* k_cache, const void* v_cache,
                                   const float* k_factors, const float* v_factors, int64_t ldkv,
                                   int64_t p0, int64_t p1, int64_t head_dim, float scale,
                                   float* m, float* l, float* acc, float* s) {
  if (!bf16_attention::supports(head_dim, rows)) {
    simd::attention_block<Avx512Vec, KvDtype::f16>(q, ldq, group, rows, first_end, k_cache, v_cache,
                                                   k_factors, v_factors, ldkv, p0, p1, head_dim,
                                                   scale, m, l, acc, s);
    return forget_bf16_attention_scratch(s);
  }
  bf16_attention::attention_blocks(
      q, ldq, group, rows, first_end, k_cache, v_cache, ldkv, p0, p1, head_dim, scale, s,
      [&](const Scratch& w, const uint8_t* kt, const uint16_t* vb, int64_t b0, int64_t b1) {
        block(w, kt, vb, group, rows, first_end, b0, b1, head_dim, m, l, acc);
      });
}

}  // namespace ellm::avx512
