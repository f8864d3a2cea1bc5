#pragma once
// The AVX2 tier's INT4 kernels (layout and arithmetic in kernels.h) over the shared driver
// (simd_int4.h), written once for both int8 dot products: vpmaddubsw + vpmaddwd on plain AVX2
// (int4.cc) and AVX-VNNI's vpdpbusd (int4_vnni.cc, compiled with -mavxvnni); `Dot` is one of
// them. Only those two files include this header.
//
// A quad (16 columns x 4 inputs in 64 bytes, kernels.h) is two 32-byte halves: half h holds the 4
// inputs of columns 8h..8h+7 in its low nibbles and of 16 + 8h.. in its high ones, one column per
// 32-bit lane. Vector v (0-3) of a block is its columns 8v..8v+7: half v & 1, nibble v >> 1.
// BF16 inputs: input t of vector v is (lane >> (8t + 4 (v >> 1))) & 15, minus the zero point as
// an integer, converted exactly to FP32. Int8 inputs: a mask (and a shift) leaves vector v's 4
// codes per lane as unsigned bytes, ready for the int8 dot product with 4 inputs.
#include <immintrin.h>

#include <array>
#include <cstring>
#include <utility>

#include "kernels/simd_int4.h"
#include "kernels/vec_avx2.h"

namespace ellm::avx2 {
namespace {

using simd::Int4Rows;

constexpr int kF32TileRows = 4;
constexpr int kInt8TileRows = 4;

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

// out[j][r][8 v] = part[j][r][v - V0] * the group's factors + out, v in [V0, V0 + kVecs).
template <int R, int B, int V0, int kVecs>
inline void add_scaled(const __m256 (&part)[B][R][kVecs], const simd::Int4Group& at, float* out) {
#pragma GCC unroll 2
  for (int j = 0; j < B; ++j)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) {
        float* o = out + (j * R + r) * kInt4Cols + 8 * (V0 + v);
        const __m256 factor = _mm256_loadu_ps(at.scales + j * at.ldp + 8 * (V0 + v));
        _mm256_storeu_ps(o, _mm256_fmadd_ps(part[j][r][v], factor, _mm256_loadu_ps(o)));
      }
}

// out[j][r][8 v] = (sum over the group of x * (q - zero)) * factor + out for blocks j < B, rows
// r < R and vectors v in [V0, V0 + kVecs) (out rows 32 floats apart, blocks R rows apart).
template <int R, int B, int V0, int kVecs>
void f32_group(const Int4Rows& in, int64_t r0, const simd::Int4Group& at, float* out) {
  const float* xf = in.xf + r0 * in.ld + at.k0;
  const __m256i mask = _mm256_set1_epi32(15);
  __m256i zero[B][kVecs];
  __m256 part[B][R][kVecs];
#pragma GCC unroll 2
  for (int j = 0; j < B; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      zero[j][v] = zeros_of(at.zeros + j * at.ldp + 8 * (V0 + v));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) part[j][r][v] = _mm256_setzero_ps();
    }
  for (int64_t q = 0; q < at.len / 4; ++q) {
#pragma GCC unroll 2
    for (int j = 0; j < B; ++j) {
      const uint8_t* c = at.codes + j * at.ldc + q * 64;
      const __m256i half[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 32))};
      // Input t: shifted[v] holds vector v's nibble in the low bits of each lane.
      auto input = [&](int t, const __m256i (&shifted)[4]) {
        __m256 wv[kVecs];
#pragma GCC unroll 4
        for (int v = 0; v < kVecs; ++v)
          wv[v] = _mm256_cvtepi32_ps(
              _mm256_sub_epi32(_mm256_and_si256(shifted[V0 + v], mask), zero[j][v]));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m256 a = _mm256_broadcast_ss(xf + r * in.ld + 4 * q + t);
#pragma GCC unroll 4
          for (int v = 0; v < kVecs; ++v) part[j][r][v] = _mm256_fmadd_ps(a, wv[v], part[j][r][v]);
        }
      };
      const __m256i h0 = half[0], h1 = half[1];
      input(0, {h0, h1, _mm256_srli_epi32(h0, 4), _mm256_srli_epi32(h1, 4)});
      input(1, {_mm256_srli_epi32(h0, 8), _mm256_srli_epi32(h1, 8), _mm256_srli_epi32(h0, 12),
                _mm256_srli_epi32(h1, 12)});
      input(2, {_mm256_srli_epi32(h0, 16), _mm256_srli_epi32(h1, 16), _mm256_srli_epi32(h0, 20),
                _mm256_srli_epi32(h1, 20)});
      input(3, {_mm256_srli_epi32(h0, 24), _mm256_srli_epi32(h1, 24), _mm256_srli_epi32(h0, 28),
                _mm256_srli_epi32(h1, 28)});
    }
  }
  add_scaled<R, B, V0, kVecs>(part, at, out);
}

// The same with int8 inputs: per block of A inputs, int32 sums from -zero * s (Dot::add adds
// the products of 4 unsigned codes and 4 int8 inputs to each lane), then partial = float(sum) *
// d + partial; at the end out = partial * factor + out.
template <class Dot, int R, int B, int V0, int kVecs, int kA>
void int8_group(const Int4Rows& in, int64_t r0, const simd::Int4Group& at, float* out) {
  const int64_t A = kA ? kA : at.A;
  const int8_t* xq = in.xq + r0 * in.ld + at.k0;
  const int32_t* s = in.s + r0 * in.ldb + at.a0;
  const float* d = in.d + r0 * in.ldb + at.a0;
  const __m256i nibble = _mm256_set1_epi8(15);
  __m256 part[B][R][kVecs];
#pragma GCC unroll 2
  for (int j = 0; j < B; ++j)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) part[j][r][v] = _mm256_setzero_ps();
  for (int64_t a = 0; a < at.len / A; ++a) {
    __m256i sum[B][R][kVecs];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i minus_s = _mm256_set1_epi32(-s[r * in.ldb + a]);
#pragma GCC unroll 2
      for (int j = 0; j < B; ++j)
#pragma GCC unroll 4
        for (int v = 0; v < kVecs; ++v)
          sum[j][r][v] = _mm256_mullo_epi32(
              zeros_of(at.zeros + j * at.ldp + 8 * (V0 + v)), minus_s);
    }
#pragma GCC unroll 8
    for (int64_t q = 0; q < A / 4; ++q) {
      const int64_t kk = a * A + 4 * q;
#pragma GCC unroll 2
      for (int j = 0; j < B; ++j) {
        const uint8_t* c = at.codes + j * at.ldc + kk * 16;
        const __m256i h0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c));
        const __m256i h1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 32));
        __m256i codes[kVecs];
#pragma GCC unroll 4
        for (int v = 0; v < kVecs; ++v) {
          const __m256i h = (V0 + v) & 1 ? h1 : h0;
          codes[v] = _mm256_and_si256((V0 + v) >> 1 ? _mm256_srli_epi16(h, 4) : h, nibble);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          int32_t four;
          std::memcpy(&four, xq + r * in.ld + kk, 4);
          const __m256i x4 = _mm256_set1_epi32(four);
#pragma GCC unroll 4
          for (int v = 0; v < kVecs; ++v) sum[j][r][v] = Dot::add(sum[j][r][v], codes[v], x4);
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 factor = _mm256_set1_ps(d[r * in.ldb + a]);
#pragma GCC unroll 2
      for (int j = 0; j < B; ++j)
#pragma GCC unroll 4
        for (int v = 0; v < kVecs; ++v)
          part[j][r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[j][r][v]), factor, part[j][r][v]);
    }
  }
  add_scaled<R, B, V0, kVecs>(part, at, out);
}

// A whole group of R rows of B blocks: one row of two blocks takes each block whole; otherwise
// the low and the high 16 columns one after the other, so that the sums stay in registers. Int8
// inputs in blocks of kA (0: at.A).
template <class Dot, bool kInt8, int R, int B, int kA>
void group(const Int4Rows& in, int64_t r0, const simd::Int4Group& at, float* out) {
  if constexpr (kInt8) {
    int8_group<Dot, R, B, 0, 2, kA>(in, r0, at, out);
    int8_group<Dot, R, B, 2, 2, kA>(in, r0, at, out);
  } else if constexpr (R == 1) {
    f32_group<R, B, 0, 4>(in, r0, at, out);
  } else {
    f32_group<R, B, 0, 2>(in, r0, at, out);
    f32_group<R, B, 2, 2>(in, r0, at, out);
  }
}

using GroupFn = void (*)(const Int4Rows&, int64_t, const simd::Int4Group&, float*);

template <class Dot>
struct Tier {
  static constexpr int64_t kDecodeRows = 4;
  template <bool kInt8, int kA, int... R>
  static constexpr std::array<GroupFn, sizeof...(R)> by_rows(std::integer_sequence<int, R...>) {
    return {group<Dot, kInt8, R + 1, 1, kA>...};
  }
  static constexpr auto kF32 = by_rows<false, 0>(std::make_integer_sequence<int, kF32TileRows>());
  static constexpr auto kInt8 = by_rows<true, 32>(std::make_integer_sequence<int, kInt8TileRows>());
  static constexpr auto kInt8AnyBlock =
      by_rows<true, 0>(std::make_integer_sequence<int, kInt8TileRows>());

  static int64_t tile_rows(const PackedWeights& w) {
    return w.int8_inputs ? kInt8TileRows : kF32TileRows;
  }
  static int64_t blocks_at_once(const PackedWeights&, int64_t rows) { return rows == 1 ? 2 : 1; }
  static void prepare(const bf16* x, int64_t ldx, int64_t rows, const PackedWeights& w,
                      Int4Rows& in) {
    simd::int4_prepare<Avx2Vec>(x, ldx, rows, w, in, quantize_32);
  }
  static void run(const Int4Rows& in, int64_t r0, int64_t rows, const PackedWeights& w,
                  int64_t b, int64_t blocks, float* out) {
    const bool blocks_of_32 = int8_block(w.group) == 32;
    const GroupFn fn =
        !w.int8_inputs ? (blocks == 2 ? group<Dot, false, 1, 2, 0> : kF32[size_t(rows - 1)])
        : blocks == 2  ? (blocks_of_32 ? group<Dot, true, 1, 2, 32> : group<Dot, true, 1, 2, 0>)
                       : (blocks_of_32 ? kInt8 : kInt8AnyBlock)[size_t(rows - 1)];
    simd::for_each_group(w, b, [&](const simd::Int4Group& at) { fn(in, r0, at, out); });
  }
};

}  // namespace
}  // namespace ellm::avx2
