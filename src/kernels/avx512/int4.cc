// AVX-512 INT4 weights (layout and arithmetic in kernels.h): the tier's widening of the codes
// for the shared group kernels (simd_int4_tile.h), in vectors of 16 columns, the 64 bytes of a
// quad (16 columns x 4 inputs, columns c and c + 16 sharing each byte) in one register.
//
// BF16 inputs (FP32 FMA chains): a lane's nibble of input t is the low 4 bits after a shift by
// 8t (+ 4 for the high columns), which vpermps takes straight as an index into the table of
// 0..15 as floats; minus the zero point (float) that is q - zero exactly.
// Int8 inputs: a mask and a shift turn the quad into the 16 low and the 16 high columns' codes as
// unsigned bytes, 4 inputs per lane as vpdpbusd (AVX-512-VNNI) multiplies them with 4 int8
// inputs; each block of inputs starts its int32 sums at -zero * (sum of the block's xq).
#include <immintrin.h>

#include <cstdint>

#include "kernels/avx512/avx512.h"
#include "kernels/simd_int4_tile.h"
#include "kernels/vec_avx512.h"

namespace ellm::avx512 {
namespace {

// 32 inputs to int8 exactly as simd::quantize_int8_block does.
inline void quantize_32(const float* x, int8_t* q, float* d, int32_t* s) {
  const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const __m512 inverse = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
  const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inverse));  // round to nearest even
  const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inverse));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(q1));
  *s = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
  *d = amax / 127.0f;
}

// The zero points of 16 columns as int32.
inline __m512i zeros_of(const uint8_t* zeros) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zeros)));
}

// The codes of the shared group kernels (simd_int4_tile.h): vectors of 16 columns, 2 to a block,
// each group kernel taking the block whole.
struct Int4Codes {
  static constexpr int kF32TileRows = 12;  // 24 FMA chains
  static constexpr int kInt8TileRows = 4;  // 8 int32 sums and 8 partial sums
  static constexpr int part_vectors(bool, int) { return 2; }

  using Quad = __m512i;
  static __m512i load(const uint8_t* c) { return _mm512_loadu_si512(c); }
  // Input t of the quad: columns 0-15 in bits 8t.., 16-31 in bits 8t + 4.. of each lane.
  template <int t>
  static void nibbles(__m512i v, __m512i (&out)[2]) {
    if constexpr (t == 0)
      out[0] = v;
    else
      out[0] = _mm512_srli_epi32(v, 8 * t);
    out[1] = _mm512_srli_epi32(v, 8 * t + 4);
  }

  using F32Zero = __m512;
  static __m512 f32_zero(const uint8_t* zeros) { return _mm512_cvtepi32_ps(zeros_of(zeros)); }
  static __m512 f32_weight(__m512i nibbles, __m512 zero) {
    const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_sub_ps(_mm512_permutexvar_ps(nibbles, table), zero);
  }

  static void int8_codes(__m512i v, __m512i (&codes)[2]) {
    const __m512i nibble = _mm512_set1_epi8(15);
    codes[0] = _mm512_and_si512(v, nibble);
    codes[1] = _mm512_and_si512(_mm512_srli_epi32(v, 4), nibble);
  }
  using Int8Zero = __m512i;
  static __m512i int8_zero(const uint8_t* zeros) { return zeros_of(zeros); }
  // -s in the low 16 bits of each lane: |s| <= 127 A fits, and so does zero * s (vpmaddwd).
  static __m512i minus_s(int32_t s) { return _mm512_set1_epi32(int32_t(uint16_t(int16_t(-s)))); }
  static __m512i start(__m512i zero, __m512i minus_s) { return _mm512_madd_epi16(zero, minus_s); }
  static __m512i dot(__m512i sum, __m512i codes, __m512i x4) {
    return _mm512_dpbusd_epi32(sum, codes, x4);
  }

  static void quantize_32(const float* x, int8_t* q, float* d, int32_t* s) {
    avx512::quantize_32(x, q, d, s);
  }
};

using Tier = simd::Int4Tier<Avx512Vec, Int4Codes>;

}  // namespace

void matmul_int4(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
                 int64_t ldy, bool accumulate, int member, int n_members,
                 std::atomic<int64_t>* pool) {
  simd::matmul_int4<Tier>(x, m, ldx, w, y, ldy, accumulate, member, n_members, pool);
}

}  // namespace ellm::avx512
