// AVX-512 INT4 weights (layout and arithmetic in kernels.h) over the shared driver
// (simd_int4.h): one group of one or two 32-column blocks for a tile of rows, the codes widened
// in registers from the 64 bytes of a quad (16 columns x 4 inputs, columns c and c + 16 sharing
// each byte).
//
// BF16 inputs (FP32 FMA chains): a lane's nibble of input t is the low 4 bits after a shift by
// 8t (+ 4 for the high columns), which vpermps takes straight as an index into the table of
// 0..15 as floats; minus the zero point (float) that is q - zero exactly.
// Int8 inputs: a mask and a shift turn the quad into the 16 low and the 16 high columns' codes as
// unsigned bytes, 4 inputs per lane as vpdpbusd (AVX-512-VNNI) multiplies them with 4 int8
// inputs; each block of inputs starts its int32 sums at -zero * (sum of the block's xq).
#include <immintrin.h>

#include <array>
#include <cstring>
#include <utility>

#include "kernels/avx512/avx512.h"
#include "kernels/simd_int4.h"
#include "kernels/vec_avx512.h"

namespace ellm::avx512 {
namespace {

using simd::Int4Rows;

constexpr int kF32TileRows = 12;  // 24 FMA chains
constexpr int kInt8TileRows = 4;  // 8 int32 sums and 8 partial sums

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

// out[j][r][32] = part[j][r] * the group's factors + out (rows 32 floats apart, blocks R rows).
template <int R, int B>
inline void add_scaled(const __m512 (&part)[B][R][2], const simd::Int4Group& at, float* out) {
#pragma GCC unroll 2
  for (int j = 0; j < B; ++j)
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int n = 0; n < 2; ++n) {
        float* o = out + (j * R + r) * kInt4Cols + 16 * n;
        const __m512 factor = _mm512_loadu_ps(at.scales + j * at.ldp + 16 * n);
        _mm512_storeu_ps(o, _mm512_fmadd_ps(part[j][r][n], factor, _mm512_loadu_ps(o)));
      }
}

// out[j][r][32] = (sum over the group of x * (q - zero)) * factor + out, for blocks j < B and
// rows r < R (out rows 32 floats apart, blocks R rows apart).
template <int R, int B>
void f32_group(const Int4Rows& in, int64_t r0, const simd::Int4Group& at, float* out) {
  const float* xf = in.xf + r0 * in.ld + at.k0;
  const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 zero[B][2];
#pragma GCC unroll 2
  for (int j = 0; j < B; ++j)
#pragma GCC unroll 2
    for (int n = 0; n < 2; ++n)
      zero[j][n] = _mm512_cvtepi32_ps(zeros_of(at.zeros + j * at.ldp + 16 * n));
  __m512 part[B][R][2];
#pragma GCC unroll 2
  for (int j = 0; j < B; ++j)
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) part[j][r][0] = part[j][r][1] = _mm512_setzero_ps();
  for (int64_t q = 0; q < at.len / 4; ++q) {
#pragma GCC unroll 2
    for (int j = 0; j < B; ++j) {
      const __m512i v = _mm512_loadu_si512(at.codes + j * at.ldc + q * 64);
      // Input t of the quad: columns 0-15 in bits 8t.., 16-31 in bits 8t + 4.. of each lane.
      auto input = [&](int t, __m512i low, __m512i high) {
        const __m512 w0 = _mm512_sub_ps(_mm512_permutexvar_ps(low, table), zero[j][0]);
        const __m512 w1 = _mm512_sub_ps(_mm512_permutexvar_ps(high, table), zero[j][1]);
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
          const __m512 a = _mm512_set1_ps(xf[r * in.ld + 4 * q + t]);
          part[j][r][0] = _mm512_fmadd_ps(a, w0, part[j][r][0]);
          part[j][r][1] = _mm512_fmadd_ps(a, w1, part[j][r][1]);
        }
      };
      input(0, v, _mm512_srli_epi32(v, 4));
      input(1, _mm512_srli_epi32(v, 8), _mm512_srli_epi32(v, 12));
      input(2, _mm512_srli_epi32(v, 16), _mm512_srli_epi32(v, 20));
      input(3, _mm512_srli_epi32(v, 24), _mm512_srli_epi32(v, 28));
    }
  }
  add_scaled<R, B>(part, at, out);
}

// The same with int8 inputs: per block of A inputs (kA when not 0), int32 sums from -zero * s,
// then partial = float(sum) * d + partial; at the end out = partial * factor + out.
template <int R, int B, int kA>
void int8_group(const Int4Rows& in, int64_t r0, const simd::Int4Group& at, float* out) {
  const int64_t A = kA ? kA : at.A;
  const int8_t* xq = in.xq + r0 * in.ld + at.k0;
  const int32_t* s = in.s + r0 * in.ldb + at.a0;
  const float* d = in.d + r0 * in.ldb + at.a0;
  const __m512i nibble = _mm512_set1_epi8(15);
  __m512i zero[B][2];
#pragma GCC unroll 2
  for (int j = 0; j < B; ++j)
#pragma GCC unroll 2
    for (int n = 0; n < 2; ++n) zero[j][n] = zeros_of(at.zeros + j * at.ldp + 16 * n);
  __m512 part[B][R][2];
#pragma GCC unroll 2
  for (int j = 0; j < B; ++j)
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) part[j][r][0] = part[j][r][1] = _mm512_setzero_ps();
  for (int64_t a = 0; a < at.len / A; ++a) {
    __m512i sum[B][R][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      // -s in the low 16 bits of each lane: |s| <= 127 A fits, and so does zero * s (vpmaddwd).
      const __m512i minus_s = _mm512_set1_epi32(int32_t(uint16_t(int16_t(-s[r * in.ldb + a]))));
#pragma GCC unroll 2
      for (int j = 0; j < B; ++j)
#pragma GCC unroll 2
        for (int n = 0; n < 2; ++n) sum[j][r][n] = _mm512_madd_epi16(zero[j][n], minus_s);
    }
#pragma GCC unroll 8
    for (int64_t q = 0; q < A / 4; ++q) {
      const int64_t kk = a * A + 4 * q;
#pragma GCC unroll 2
      for (int j = 0; j < B; ++j) {
        const __m512i v = _mm512_loadu_si512(at.codes + j * at.ldc + kk * 16);
        const __m512i low = _mm512_and_si512(v, nibble);
        const __m512i high = _mm512_and_si512(_mm512_srli_epi32(v, 4), nibble);
#pragma GCC unroll 6
        for (int r = 0; r < R; ++r) {
          int32_t four;
          std::memcpy(&four, xq + r * in.ld + kk, 4);
          const __m512i x4 = _mm512_set1_epi32(four);
          sum[j][r][0] = _mm512_dpbusd_epi32(sum[j][r][0], low, x4);
          sum[j][r][1] = _mm512_dpbusd_epi32(sum[j][r][1], high, x4);
        }
      }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 factor = _mm512_set1_ps(d[r * in.ldb + a]);
#pragma GCC unroll 2
      for (int j = 0; j < B; ++j)
#pragma GCC unroll 2
        for (int n = 0; n < 2; ++n)
          part[j][r][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[j][r][n]), factor, part[j][r][n]);
    }
  }
  add_scaled<R, B>(part, at, out);
}

using GroupFn = void (*)(const Int4Rows&, int64_t, const simd::Int4Group&, float*);

template <int... R>
constexpr std::array<GroupFn, sizeof...(R)> f32_by_rows(std::integer_sequence<int, R...>) {
  return {f32_group<R + 1, 1>...};
}
template <int kA, int... R>
constexpr std::array<GroupFn, sizeof...(R)> int8_by_rows(std::integer_sequence<int, R...>) {
  return {int8_group<R + 1, 1, kA>...};
}

constexpr auto kF32 = f32_by_rows(std::make_integer_sequence<int, kF32TileRows>());
template <int kA>
constexpr auto kInt8 = int8_by_rows<kA>(std::make_integer_sequence<int, kInt8TileRows>());

// A tile of `rows` rows of one block, or 1 or 2 rows of two blocks (decode: more chains).
GroupFn f32_kernel(int64_t rows, int64_t blocks) {
  if (blocks == 2) return rows == 1 ? f32_group<1, 2> : f32_group<2, 2>;
  return kF32[size_t(rows - 1)];
}
template <int kA>
GroupFn int8_kernel(int64_t rows, int64_t blocks) {
  if (blocks == 2) return rows == 1 ? int8_group<1, 2, kA> : int8_group<2, 2, kA>;
  return kInt8<kA>[size_t(rows - 1)];
}

struct Tier {
  static constexpr int64_t kDecodeRows = 4;
  static int64_t tile_rows(const PackedWeights& w) {
    return w.int8_inputs ? kInt8TileRows : kF32TileRows;
  }
  static int64_t blocks_at_once(const PackedWeights&, int64_t rows) { return rows <= 2 ? 2 : 1; }
  static void prepare(const bf16* x, int64_t ldx, int64_t rows, const PackedWeights& w,
                      Int4Rows& in) {
    simd::int4_prepare<Avx512Vec>(x, ldx, rows, w, in, quantize_32);
  }
  static void run(const Int4Rows& in, int64_t r0, int64_t rows, const PackedWeights& w,
                  int64_t b, int64_t blocks, float* out) {
    const GroupFn fn = !w.int8_inputs                ? f32_kernel(rows, blocks)
                       : int8_block(w.group) == 32 ? int8_kernel<32>(rows, blocks)
                                                   : int8_kernel<0>(rows, blocks);
    simd::for_each_group(w, b, [&](const simd::Int4Group& at) { fn(in, r0, at, out); });
  }
};

}  // namespace

void matmul_int4(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
                 int64_t ldy, bool accumulate, int member, int n_members,
                 std::atomic<int64_t>* pool) {
  simd::matmul_int4<Tier>(x, m, ldx, w, y, ldy, accumulate, member, n_members, pool);
}

}  // namespace ellm::avx512
