#pragma once
// AVX2 vector traits: the 8-lane operations the shared SIMD templates (kernels/simd_*.h) are
// written with. Only files compiled with the AVX2 flags (kernels/avx2/, tools/avx2/) include
// this.
#include <immintrin.h>

#include <cstdint>

namespace ellm {

struct Avx2Vec {
  using F = __m256;   // 8 floats
  using I = __m256i;  // 8 int32
  using M = __m256;   // a lane mask: all ones or all zeros per lane
  static constexpr int kLanes = 8;
  // Tails shorter than a vector go to the scalar twin (AVX2 has no cheap masked load/store).
  static constexpr bool kMaskedTail = false;
  static constexpr int kSumAccumulators = 1;  // independent sums in a row reduction
  // Decode attention: P.V takes one row at a time, 8 vectors of dimensions at a time, and the
  // K pass leaves each q chunk in memory (16 registers: the accumulators need them).
  static constexpr int kPvRows = 1, kPvVectors = 8;
  static constexpr bool kQInRegisters = false;
  static constexpr int dot_fetch_lines(int rows) { return rows == 1 ? 2 : 1; }
  static constexpr int pv_fetch_lines(int vectors) { return 2; }
  // Prefill attention: sub-blocks of 16 positions (2 vectors of scores; 4 rows x 2 vectors of
  // accumulators), tiles of 4 rows; K and V of the next sub-block fetched into L1, a line per
  // 32 dimensions.
  static constexpr int kPrefillVectors = 2;
  static constexpr bool kPairTiles = false;
  static constexpr int64_t kAheadPositions = 0;
  static constexpr int64_t kPrefetchDims = 32;
  static constexpr auto kPrefetchHint = _MM_HINT_T0;

  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F load(const float* p, int64_t) { return load(p); }  // whole vectors only
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void store(float* p, F v, int64_t) { store(p, v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fmsub(F a, F b, F c) { return _mm256_fmsub_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F round_nearest(F x) {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // p * 2^n for integral n in [-150, 128], rounded once: as two exact-exponent factors, since
  // one biased exponent field holds only [-126, 127].
  static F scale_pow2(F p, F n) {
    __m256i ni = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(ni, 1);
    auto pow2 = [](__m256i e) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
    };
    return _mm256_mul_ps(_mm256_mul_ps(p, pow2(half)), pow2(_mm256_sub_epi32(ni, half)));
  }
  static float hsum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float hmax(F v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static F max_first(F acc, F x, int64_t) { return max(acc, x); }  // whole vectors only
  // Lane j = the sum of the 8 floats of v[j].
  static F sum_lanes(const F* v) {
    __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
    __m256 c = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);  // per 128-bit half: v0..v3, v4..v7
    return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
  }

  // Lane masks.
  static M lanes_greater(I a, I b) { return _mm256_castsi256_ps(_mm256_cmpgt_epi32(a, b)); }
  static M not_equal(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_NEQ_OQ); }
  static M both(M a, M b) { return _mm256_and_ps(a, b); }
  static F select(M m, F if_false, F if_true) { return _mm256_blendv_ps(if_false, if_true, m); }
  static F zero_unless(M m, F v) { return _mm256_and_ps(v, m); }
  static M first_lanes(int64_t n) {  // lanes < n (none for n <= 0)
    return _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_ps(float(n)), _CMP_LT_OQ);
  }

  // Conversions. FP16 and BF16 arrays of n <= 8 elements (whole vectors only here).
  static F load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F load_f16(const uint16_t* p, int64_t) { return load_f16(p); }
  // 16 FP8 E4M3 codes (no NaN) as 2 vectors of their values times 2^-8, exactly: each code,
  // sign-extended and shifted, is the FP16 with its sign, its exponent as the low 4 bits of the
  // exponent field and its mantissa on top, which is the value times 2^-8 (subnormals and zero
  // included, since FP16 has the same subnormal step relative to its bias); F16C widens those.
  // (Widening straight to FP32 bits needs a multiply that meets denormal FP32 inputs for
  // exponent-0 codes: on AMD EPYC that ran blocks holding any at a third of the speed.)
  // This is the cheapest exact widening found; on AMD EPYC Zen 3 the decode product is bound by
  // its instruction count (about 13.5 GB/s of codes per core in cache, BF16 43 GB/s of weights).
  // Measured there and slower or no faster: FP32 bits by integer ops (sign-extend to 32 bits,
  // shift, mask, or in the exponent bias: 14.5 GB/s even without exponent-0 codes, 12.4 with a
  // per-16-codes test for them and this path as fallback); bytes unpacked in lane then shifted
  // (13.5); vpmaddubsw by 128 as sign-extend-and-shift of even and odd codes (13.4); half of the
  // codes each way (13.0); the FP16 words stored and converted from memory instead of extracted
  // (12.4). The F16C conversions set the pace (2 cycles per 8 codes there); an exact widening
  // without them needs the exponent-0 codes handled, so at least 4 instructions per 8 codes.
  // tests/kernels/fp8_bits_test.cc pins every code's and every product's bits.
  static void load_fp8_x2(const uint8_t* p, F& lo, F& hi) {
    __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16(int16_t(0xbf80)));
    lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  }
  // 8 FP8 E4M3 codes (no NaN) as their values times 2^-8, exactly (as load_fp8_x2).
  static F load_fp8(const uint8_t* p, int64_t = 0) {
    __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16(int16_t(0xbf80))));
  }
  static F load_i8(const uint8_t* p, int64_t = 0) {  // 8 int8 codes, exactly
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static F load_bf16(const uint16_t* p, int64_t) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static void store_f16(uint16_t* out, F v, int64_t) {  // round to nearest even
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // dst[i * ldd + j] = lane i of r[j]: 8 vectors stored as the columns of an 8 x 8 tile.
  static void transpose_rows(__m256* r, float* dst, int64_t ldd) {
    __m256 t[8];
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
  static I bits(F v) { return _mm256_castps_si256(v); }
  static I set1_i(int32_t v) { return _mm256_set1_epi32(v); }
  static I load_i(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static F permute(F v, I index) { return _mm256_permutevar8x32_ps(v, index); }  // lane t: v[index[t]]
  static I and_i(I a, I b) { return _mm256_and_si256(a, b); }
  static I or_i(I a, I b) { return _mm256_or_si256(a, b); }
  static I add_i(I a, I b) { return _mm256_add_epi32(a, b); }
  static F to_float(I v) { return _mm256_cvtepi32_ps(v); }  // each lane's int32, exactly below 2^24
  static I high_half(I a) { return _mm256_srli_epi32(a, 16); }
  static I select_i(M m, I if_false, I if_true) {
    return _mm256_blendv_epi8(if_false, if_true, _mm256_castps_si256(m));
  }
  static void store_u16(uint16_t* out, I v, int64_t) {  // each lane's value (< 2^16)
    // packus interleaves the 128-bit lanes; the permute puts them back in order.
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
  }
};

}  // namespace ellm
