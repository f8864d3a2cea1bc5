#pragma once
// AVX-512 vector traits: the 16-lane operations the shared SIMD templates (kernels/simd_*.h) are
// written with. Only files compiled with the AVX-512 flags (kernels/avx512/, kernels/amx/,
// tools/avx512/) include this.
#include <immintrin.h>

#include <cstdint>

namespace ellm {

struct Avx512Vec {
  using F = __m512;   // 16 floats
  using I = __m512i;  // 16 int32
  using M = __mmask16;
  static constexpr int kLanes = 16;
  static constexpr bool kMaskedTail = true;   // tails are masked vectors
  static constexpr int kSumAccumulators = 2;  // independent sums in a row reduction
  // Decode attention: P.V takes up to four rows at a time (each V vector widened once for all),
  // 16 accumulators a pass over the positions, and the K pass holds the q chunks in registers.
  static constexpr int kPvRows = 4, kPvVectors = 16;
  static constexpr bool kQInRegisters = true;
  static constexpr int dot_fetch_lines(int rows) { return 8 / rows; }
  static constexpr int pv_fetch_lines(int vectors) { return vectors / 2; }
  // Prefill attention: sub-blocks of 64 positions (4 vectors of scores and of accumulators),
  // tiles of 4 rows (2 for a block of 2 rows); K and V fetched into L2 32 positions ahead: that
  // keeps what is in flight (K and V of all heads: 2 x 32 x 2 KiB for Qwen3-0.6B) well inside L2.
  static constexpr int kPrefillVectors = 4;
  static constexpr bool kPairTiles = true;
  static constexpr int64_t kAheadPositions = 32;
  static constexpr int64_t kPrefetchDims = 16;
  static constexpr auto kPrefetchHint = _MM_HINT_T1;

  static M tail_mask(int64_t remaining) {
    return remaining >= 16 ? M(0xffff) : M((1u << remaining) - 1);
  }

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void store(float* p, F v, int64_t n) { _mm512_mask_storeu_ps(p, tail_mask(n), v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fmsub(F a, F b, F c) { return _mm512_fmsub_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F round_nearest(F x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static F scale_pow2(F p, F n) { return _mm512_scalef_ps(p, n); }  // p * 2^n, rounded once
  static float hsum(F v) { return _mm512_reduce_add_ps(v); }
  static float hmax(F v) { return _mm512_reduce_max_ps(v); }
  static F max_first(F acc, F x, int64_t n) { return _mm512_mask_max_ps(acc, tail_mask(n), acc, x); }
  // Lane j = the sum of the 16 floats of v[j]: a transpose folded into an add tree.
  static F sum_lanes(const F* v) {
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
  static F unpacklo_pd(F a, F b) {
    return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
  }
  static F unpackhi_pd(F a, F b) {
    return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
  }

  // Lane masks.
  static M lanes_greater(I a, I b) { return _mm512_cmpgt_epi32_mask(a, b); }
  static M not_equal(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_NEQ_OQ); }
  static M both(M a, M b) { return a & b; }
  static F select(M m, F if_false, F if_true) { return _mm512_mask_blend_ps(m, if_false, if_true); }
  static F zero_unless(M m, F v) { return _mm512_maskz_mov_ps(m, v); }
  static M first_lanes(int64_t n) { return n > 0 ? tail_mask(n) : M(0); }  // lanes < n

  // Conversions; the forms with n touch only the first n <= 16 elements.
  static F load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F load_f16(const uint16_t* p, int64_t n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail_mask(n), p));
  }
  // 32 FP8 E4M3 codes (no NaN) as 2 vectors of their values times 2^-8, exactly (as Avx2Vec).
  static void load_fp8_x2(const uint8_t* p, F& lo, F& hi) {
    __m512i h = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    h = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(h, 8), 1),
                         _mm512_set1_epi16(int16_t(0xbf80)));
    lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
  }
  // 16 FP8 E4M3 codes (no NaN; with n, the first n) as their values times 2^-8, exactly.
  static F load_fp8(const uint8_t* p, int64_t n = 16) {
    __m256i h = _mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(tail_mask(n), p));
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16(int16_t(0xbf80))));
  }
  static F load_i8(const uint8_t* p, int64_t n = 16) {  // 16 (or n) int8 codes, exactly
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(tail_mask(n), p)));
  }
  static F load_bf16(const uint16_t* p, int64_t n) {
    __m256i h = _mm256_maskz_loadu_epi16(tail_mask(n), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static void store_f16(uint16_t* out, F v, int64_t n) {  // round to nearest even
    _mm256_mask_storeu_epi16(out, tail_mask(n),
                             _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // dst[i * ldd + j] = lane i of r[j]: 16 vectors stored as the columns of a 16 x 16 tile.
  static void transpose_rows(__m512* r, float* dst, int64_t ldd) {
    __m512 t[16];
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
  static I bits(F v) { return _mm512_castps_si512(v); }
  static I set1_i(int32_t v) { return _mm512_set1_epi32(v); }
  static I load_i(const int32_t* p) { return _mm512_loadu_si512(p); }
  static F permute(F v, I index) { return _mm512_permutexvar_ps(index, v); }  // lane t: v[index[t]]
  static I and_i(I a, I b) { return _mm512_and_si512(a, b); }
  static I or_i(I a, I b) { return _mm512_or_si512(a, b); }
  static I add_i(I a, I b) { return _mm512_add_epi32(a, b); }
  static F to_float(I v) { return _mm512_cvtepi32_ps(v); }  // each lane's int32, exactly below 2^24
  static I high_half(I a) { return _mm512_srli_epi32(a, 16); }
  static I select_i(M m, I if_false, I if_true) { return _mm512_mask_blend_epi32(m, if_false, if_true); }
  static void store_u16(uint16_t* out, I v, int64_t n) {  // each lane's value (< 2^16)
    _mm256_mask_storeu_epi16(out, tail_mask(n), _mm512_cvtepi32_epi16(v));
  }
};

}  // namespace ellm
