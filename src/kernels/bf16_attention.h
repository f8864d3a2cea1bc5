#pragma once
// The prefill attention block on BF16 dot products (contract of attention_block in
// kernel_table.h), shared by the tiers that have them: AVX-512-BF16 (vdpbf16ps,
// kernels/avx512/attention_bf16.cc) and AMX (tile products, kernels/amx/attention.cc). Each
// includes this header with its own flags and brings only the products of one block. Per call (up
// to 256 query rows), once:
//   qb [256][head_dim]      Q * scale in BF16, rows past `rows` zero
// and per block of up to 128 positions:
//   kt [ks][pt][16][16][2]  K^T in pairs of dims: k step ks (32 dims), position tile pt (16)
//   s  [256][128]           scores, FP32
//   pb [256][128]           probabilities in BF16, zero past each row's visible positions
//   vb [kp][16][head_dim][2] V in pairs of positions, every dim
// and acc itself accumulates O = P.V (its rows rescaled first where the max moved).
// Q, K, P and V are rounded to BF16 (8 significant bits) for the products, as BF16 attention in
// the reference implementations does; scores, the softmax and the output stay FP32.
//
// A row's result depends only on the row: each score is one chain over the dims in order, each
// output one chain over the positions in order, and the blocks start at multiples of 128
// positions of the range (the driver's ranges start on 1024-position segments).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/simd_attention_prefill.h"
#include "kernels/vec_avx512.h"

namespace ellm::bf16_attention {

constexpr int64_t kRows = kBf16AttentionTileRows;  // most query rows per call (the driver's tile)
constexpr int64_t kPositions = 128;  // positions per block
constexpr int64_t kPositionTiles = kPositions / 16;
constexpr int64_t kCacheBlocks = 256;  // packed blocks kept per member (32k positions)

// The shapes the block takes; others go to the tier's FP32 block.
inline bool supports(int64_t head_dim, int64_t rows) {
  return head_dim % 32 == 0 && head_dim <= 256 && rows <= kRows;
}

// 32 FP16 as 16 BF16 pairs (one 512-bit vector of dwords).
inline __m512i f16x32_to_bf16(const f16* p) {
  return (__m512i)_mm512_cvtne2ps_pbh(Avx512Vec::load_f16(p + 16), Avx512Vec::load_f16(p));
}

// dst row i (64 bytes, 16 dwords) = dword i of r[0..15]: a 16 x 16 dword transpose.
inline void transpose_dwords16(__m512i* r, uint8_t* dst) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    __m512i even_lo = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
    __m512i odd_lo = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xDD);
    __m512i even_hi = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
    __m512i odd_hi = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xDD);
    _mm512_store_si512(dst + c * 64, _mm512_shuffle_i32x4(even_lo, even_hi, 0x88));
    _mm512_store_si512(dst + (4 + c) * 64, _mm512_shuffle_i32x4(odd_lo, odd_hi, 0x88));
    _mm512_store_si512(dst + (8 + c) * 64, _mm512_shuffle_i32x4(even_lo, even_hi, 0xDD));
    _mm512_store_si512(dst + (12 + c) * 64, _mm512_shuffle_i32x4(odd_lo, odd_hi, 0xDD));
  }
}

// kt tile (ks, pt) = K^T of positions [16 pt, 16 pt + 16) x dims [32 ks, 32 ks + 32); positions
// at or past `width` are zero.
inline void pack_k(const f16* k, int64_t ldk, int64_t width, int64_t head_dim, uint8_t* kt) {
  const int64_t steps = head_dim / 32, tiles = (width + 15) / 16;
  for (int64_t pt = 0; pt < tiles; ++pt)
    for (int64_t ks = 0; ks < steps; ++ks) {
      __m512i r[16];
      for (int j = 0; j < 16; ++j) {
        int64_t p = pt * 16 + j;
        r[j] = p < width ? f16x32_to_bf16(k + p * ldk + ks * 32) : _mm512_setzero_si512();
      }
      transpose_dwords16(r, kt + (ks * kPositionTiles + pt) * 1024);
    }
}

// vb row i = positions 2i and 2i + 1, interleaved dim by dim; positions at or past `width` are
// zero, up to a whole 32 positions.
inline void pack_v(const f16* v, int64_t ldv, int64_t width, int64_t head_dim, uint16_t* vb) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                              24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17,
                                              1, 16, 0);
  const int64_t pairs = (width + 31) / 32 * 16;
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t p = 2 * i;
    uint16_t* row = vb + i * 2 * head_dim;
    for (int64_t d = 0; d < head_dim; d += 16) {
      __m512 a = p < width ? Avx512Vec::load_f16(v + p * ldv + d) : _mm512_setzero_ps();
      __m512 b = p + 1 < width ? Avx512Vec::load_f16(v + (p + 1) * ldv + d) : _mm512_setzero_ps();
      __m512i both = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // a in the low half, b in the high
      _mm512_storeu_si512(row + 2 * d, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

// Online-softmax update of row s[0:128] against `visible` positions: probabilities in BF16 into
// pb[0:128]; returns the factor the row's accumulated output must be scaled by.
inline float softmax_row_bf16(const float* s, int64_t visible, float& m, float& l, uint16_t* pb) {
  if (visible <= 0) {
    for (int64_t j = 0; j < kPositions; j += 32) _mm512_storeu_si512(pb + j, _mm512_setzero_si512());
    return 1.0f;
  }
  const float new_max = std::max(m, simd::row_max<Avx512Vec>(s, visible));
  const float correction = simd::softmax_correction(m, new_max);
  const __m512 vnew_max = _mm512_set1_ps(new_max);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < kPositions; j += 32) {
    __m512 p[2];
    for (int h = 0; h < 2; ++h) {
      int64_t at = j + 16 * h;
      __mmask16 mask = at < visible ? Avx512Vec::tail_mask(visible - at) : 0;
      p[h] = _mm512_maskz_mov_ps(
          mask, simd::exp<Avx512Vec>(_mm512_sub_ps(_mm512_loadu_ps(s + at), vnew_max)));
      vsum = _mm512_add_ps(vsum, p[h]);
    }
    _mm512_storeu_si512(pb + j, (__m512i)_mm512_cvtne2ps_pbh(p[1], p[0]));
  }
  l = l * correction + _mm512_reduce_add_ps(vsum);
  m = new_max;
  return correction;
}

// The packed K^T and V of whole 128-position blocks, kept across the calls of one attention
// pass for one (sequence, layer, KV head): a member takes a KV head's query tiles one after
// another, and each tile reads every block the one before it read. The driver clears the tag at
// the start of a pass (and after anything else used the scratch).
struct PackCache {
  const f16* k;
  const f16* v;
  int64_t ldkv;
  int64_t blocks;  // blocks [0, blocks) are packed
};

// Bytes of K^T (or of V) of one 128-position block in pairs.
inline int64_t packed_bytes(int64_t head_dim) { return head_dim * kPositions * 2; }

// Scratch pieces, 64-byte aligned: [cache tag] [kt] [vb] [qb] [s] [pb] [cached blocks].
struct Scratch {
  PackCache* cache;
  uint8_t* kt;
  uint16_t* vb;
  uint16_t* qb;
  float* s;
  uint16_t* pb;
  uint8_t* cached;  // kCacheBlocks x [K^T | V]

  Scratch(float* scratch, int64_t head_dim) {
    uint8_t* at = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t(63));
    cache = reinterpret_cast<PackCache*>(at);
    at += 64;
    kt = at;
    at += packed_bytes(head_dim);
    vb = reinterpret_cast<uint16_t*>(at);
    at += packed_bytes(head_dim);
    qb = reinterpret_cast<uint16_t*>(at);
    at += kRows * head_dim * 2;
    s = reinterpret_cast<float*>(at);
    at += kRows * kPositions * 4;
    pb = reinterpret_cast<uint16_t*>(at);
    at += kRows * kPositions * 2;
    cached = at;
  }
  static int64_t bytes(int64_t head_dim) {
    return 63 + 64 + 2 * packed_bytes(head_dim) + kRows * head_dim * 2 +
           kRows * kPositions * 4 + kRows * kPositions * 2 +
           kCacheBlocks * 2 * packed_bytes(head_dim);
  }
};

inline size_t scratch_floats(int64_t head_dim) { return size_t((Scratch::bytes(head_dim) + 3) / 4); }

inline void clear_cache(float* s) {
  std::fill_n(s, 32, 0.0f);  // the tag, wherever the 64-byte alignment puts it
}

// qb = Q * scale in BF16, padded with zero rows to whole 16-row tiles.
inline void pack_q(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t head_dim,
                   float scale, uint16_t* qb) {
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < (rows + 15) / 16 * 16; ++r)
    for (int64_t d = 0; d < head_dim; d += 32) {
      __m512i pair = _mm512_setzero_si512();
      if (r < rows) {
        const float* qr = q + (r / group) * ldq + (r % group) * head_dim + d;
        pair = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_loadu_ps(qr + 16), vscale),
                                            _mm512_mul_ps(_mm512_loadu_ps(qr), vscale));
      }
      _mm512_store_si512(qb + r * head_dim + d, pair);
    }
}

// K^T and V of positions [p, p + width): from the pass's cache when packed by an earlier call,
// else packed now (into the cache when the block is whole and next in line).
inline std::pair<const uint8_t*, const uint16_t*> packed_block(const Scratch& w, bool cacheable,
                                                               const f16* k, const f16* v,
                                                               int64_t ldkv, int64_t p,
                                                               int64_t width, int64_t head_dim) {
  const int64_t b = p / kPositions;
  PackCache& cache = *w.cache;
  if (cacheable && width == kPositions && b < kCacheBlocks && b <= cache.blocks) {
    uint8_t* kt = w.cached + b * 2 * packed_bytes(head_dim);
    uint16_t* vb = reinterpret_cast<uint16_t*>(kt + packed_bytes(head_dim));
    if (b == cache.blocks) {
      pack_k(k + p * ldkv, ldkv, width, head_dim, kt);
      pack_v(v + p * ldkv, ldkv, width, head_dim, vb);
      ++cache.blocks;
    }
    return {kt, vb};
  }
  pack_k(k + p * ldkv, ldkv, width, head_dim, w.kt);
  pack_v(v + p * ldkv, ldkv, width, head_dim, w.vb);
  return {w.kt, w.vb};
}

// Softmax of every row of a block's scores (s[r][0:width]) into pb; rows past `rows` get zero
// probabilities. correction[r]: the factor row r's output must be scaled by.
inline void softmax_rows(const Scratch& w, int64_t group, int64_t rows, int64_t first_end, int64_t p0,
                         int64_t p1, float* m, float* l, float* correction) {
  for (int64_t r = 0; r < (rows + 15) / 16 * 16; ++r) {
    float unused_m = -INFINITY, unused_l = 0;
    int64_t visible = r < rows ? std::min(p1, first_end + r / group) - p0 : 0;
    correction[r] = softmax_row_bf16(w.s + r * kPositions, std::min(visible, p1 - p0),
                                     r < rows ? m[r] : unused_m, r < rows ? l[r] : unused_l,
                                     w.pb + r * kPositions);
  }
}

// acc[r] *= correction[r] for the rows whose maximum moved.
inline void rescale_rows(const float* correction, int64_t rows, int64_t head_dim, float* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    if (correction[r] == 1.0f) continue;
    const __m512 c = _mm512_set1_ps(correction[r]);
    float* a = acc + r * head_dim;
    for (int64_t d = 0; d < head_dim; d += 16)
      _mm512_storeu_ps(a + d, _mm512_mul_ps(_mm512_loadu_ps(a + d), c));
  }
}

// attention_block over an FP16 cache: the blocks of [p0, p1) in order, each through
// block(w, kt, vb, p, end) (its products; the tier's). The caller checked supports().
template <class Block>
void attention_blocks(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
                      const void* k_cache, const void* v_cache, int64_t ldkv, int64_t p0,
                      int64_t p1, int64_t head_dim, float scale, float* s, Block&& block) {
  const auto* k = static_cast<const f16*>(k_cache);
  const auto* v = static_cast<const f16*>(v_cache);
  const Scratch w(s, head_dim);
  // Blocks are cached by their index, so only ranges that start on a block boundary use them.
  const bool cacheable = p0 % kPositions == 0;
  PackCache& cache = *w.cache;
  if (cacheable && (cache.k != k || cache.v != v || cache.ldkv != ldkv)) cache = {k, v, ldkv, 0};
  pack_q(q, ldq, group, rows, head_dim, scale, w.qb);
  for (int64_t p = p0; p < p1; p += kPositions) {
    if (first_end + (rows - 1) / group <= p) break;  // causal: no row sees this block or later
    const int64_t end = std::min(p1, p + kPositions);
    auto [kt, vb] = packed_block(w, cacheable, k, v, ldkv, p, end - p, head_dim);
    block(w, kt, vb, p, end);
  }
}

}  // namespace ellm::bf16_attention
