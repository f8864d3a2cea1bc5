#pragma once
// The AVX2 tier's INT4 kernels (layout and arithmetic in kernels.h): its widening of the codes
// for the shared group kernels (simd_int4_tile.h), written once for both int8 dot products:
// vpmaddubsw + vpmaddwd on plain AVX2 (int4.cc) and AVX-VNNI's vpdpbusd (int4_vnni.cc, compiled
// with -mavxvnni); `Dot` is one of them. Only those two files include this header.
//
// A quad (16 columns x 4 inputs in 64 bytes, kernels.h) is two 32-byte halves: half h holds the 4
// inputs of columns 8h..8h+7 in its low nibbles and of 16 + 8h.. in its high ones, one column per
// 32-bit lane. Vector v (0-3) of a block is its columns 8v..8v+7: half v & 1, nibble v >> 1.
// BF16 inputs: input t of vector v is (lane >> (8t + 4 (v >> 1))) & 15, minus the zero point as
// an integer, converted exactly to FP32. Int8 inputs: a mask (and a shift) leaves vector v's 4
// codes per lane as unsigned bytes, ready for the int8 dot product with 4 inputs.
#include <immintrin.h>

#include <cstdint>

#include "kernels/simd_int4_tile.h"
#include "kernels/vec_avx2.h"

namespace ellm::avx2 {
namespace {

// 32 inputs to int8 exactly as simd::quantize_int8_block does.
inline void quantize_32(const float* x, int8_t* q, float* d, int32_t* s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float largest = _mm_cvtss_f32(m);
  const __m256 inverse = _mm256_set1_ps(largest > 0 ? 127.0f / largest : 0.0f);
  __m256i c[4];
  for (int i = 0; i < 4; ++i) c[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse));  // nearest even
  // Narrow 32 int32 to 32 int8 (exact: |c| <= 127); packs work per 128-bit lane, so restore order.
  const __m256i words = _mm256_packs_epi32(c[0], c[1]), words2 = _mm256_packs_epi32(c[2], c[3]);
  const __m256i bytes = _mm256_packs_epi16(words, words2);
  const __m256i ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
  __m256i total = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
  *s = _mm_cvtsi128_si32(t);
  *d = largest / 127.0f;
}

// The zero points of 8 columns as int32.
inline __m256i zeros_of(const uint8_t* zeros) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(zeros)));
}

// The codes of the shared group kernels (simd_int4_tile.h): vectors of 8 columns, 4 to a block.
template <class Dot>
struct Int4Codes {
  static constexpr int kF32TileRows = 4;
  static constexpr int kInt8TileRows = 4;
  // One row of FP32 sums takes the block whole; otherwise the low and the high 16 columns one
  // after the other, so that the sums stay in registers.
  static constexpr int part_vectors(bool int8, int rows) { return !int8 && rows == 1 ? 4 : 2; }

  struct Quad {
    __m256i h0, h1;
  };
  static Quad load(const uint8_t* c) {
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 32))};
  }
  // Vector v of input t: half v & 1, shifted by 8t (+ 4 for the high columns, v >> 1).
  template <int t>
  static void nibbles(const Quad& q, __m256i (&out)[4]) {
    if constexpr (t == 0) {
      out[0] = q.h0, out[1] = q.h1;
    } else {
      out[0] = _mm256_srli_epi32(q.h0, 8 * t), out[1] = _mm256_srli_epi32(q.h1, 8 * t);
    }
    out[2] = _mm256_srli_epi32(q.h0, 8 * t + 4), out[3] = _mm256_srli_epi32(q.h1, 8 * t + 4);
  }

  using F32Zero = __m256i;
  static __m256i f32_zero(const uint8_t* zeros) { return zeros_of(zeros); }
  static __m256 f32_weight(__m256i nibbles, __m256i zero) {
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(nibbles, _mm256_set1_epi32(15)), zero));
  }

  static void int8_codes(const Quad& q, __m256i (&codes)[4]) {
    const __m256i nibble = _mm256_set1_epi8(15);
    codes[0] = _mm256_and_si256(q.h0, nibble);
    codes[1] = _mm256_and_si256(q.h1, nibble);
    codes[2] = _mm256_and_si256(_mm256_srli_epi16(q.h0, 4), nibble);
    codes[3] = _mm256_and_si256(_mm256_srli_epi16(q.h1, 4), nibble);
  }
  using Int8Zero = const uint8_t*;  // widened where a block of inputs starts its sums
  static const uint8_t* int8_zero(const uint8_t* zeros) { return zeros; }
  static __m256i minus_s(int32_t s) { return _mm256_set1_epi32(-s); }
  static __m256i start(const uint8_t* zeros, __m256i minus_s) {
    return _mm256_mullo_epi32(zeros_of(zeros), minus_s);
  }
  static __m256i dot(__m256i sum, __m256i codes, __m256i x4) { return Dot::add(sum, codes, x4); }

  static void quantize_32(const float* x, int8_t* q, float* d, int32_t* s) {
    avx2::quantize_32(x, q, d, s);
  }
};

template <class Dot>
using Tier = simd::Int4Tier<Avx2Vec, Int4Codes<Dot>>;

}  // namespace
}  // namespace ellm::avx2
