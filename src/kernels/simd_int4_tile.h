#pragma once
// The INT4 group kernels (layout and arithmetic in kernels.h) over vector traits V and a tier's
// widening of the codes W, and the Tier of the shared driver (simd_int4.h) built from them: one
// group of one 32-column block for a tile of rows, the codes widened in registers from
// the 64 bytes of a quad (16 columns x 4 inputs, columns c and c + 16 sharing each byte).
//
// Vector u (of kInt4Cols / V::kLanes) of a block is its columns u * kLanes on. BF16 inputs: FP32
// FMA chains, partial = x * (q - zero) + partial, q - zero exact in FP32. Int8 inputs: per block
// of A inputs, int32 sums from -zero * s (s: the sum of the block's int8 inputs), then each
// unsigned code times its int8 input added in (W::dot, 4 inputs per lane), then partial =
// float(sum) * d + partial. At the end of a group, out = partial * factor + out.
//
// W provides (static members):
//   Quad, load(codes)         the 64 bytes of a quad in registers
//   nibbles<t>(quad, I[])     for input t of the quad, each vector's code in the low 4 bits of
//                             each lane (other bits above them)
//   F32Zero, f32_zero(zeros)  the zero points of a vector for the BF16 path, and
//   f32_weight(nibbles, zero) q - zero as FP32
//   int8_codes(quad, I[])     each vector's codes of 4 inputs as unsigned bytes
//   Int8Zero, int8_zero(zeros), minus_s(s), start(zero, minus_s)   the int32 sums' start, -zero * s
//   dot(sum, codes, x4)       sum + the products of 4 unsigned codes and 4 int8 inputs, per lane
//   quantize_32(x, q, d, s)   32 inputs to int8, bit for bit simd::quantize_int8_block
//   part_vectors(int8, rows)  vectors of columns a group kernel takes at once (the partial sums
//                             stay in registers)
//   kF32TileRows, kInt8TileRows   rows per tile
#include <xmmintrin.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/simd_int4.h"

namespace ellm::simd {

// out[r][kLanes v] = part[r][v - V0] * the group's factors + out, v in [V0, V0 + kVecs) (out
// rows 32 floats apart).
template <class V, int R, int V0, int kVecs>
inline void int4_add_scaled(const typename V::F (&part)[R][kVecs], const Int4Group& at, float* out) {
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      float* o = out + r * kInt4Cols + V::kLanes * (V0 + v);
      const typename V::F factor = V::load(at.scales + V::kLanes * (V0 + v));
      V::store(o, V::fmadd(part[r][v], factor, V::load(o)));
    }
}

// zero[v] = to_zero(the zero points of vector V0 + v), part = 0: a group kernel's start.
template <class V, int R, int V0, int kVecs, class Zero, class ToZero>
inline void int4_start(const Int4Group& at, ToZero&& to_zero, Zero (&zero)[kVecs],
                       typename V::F (&part)[R][kVecs]) {
#pragma GCC unroll 4
  for (int v = 0; v < kVecs; ++v) {
    zero[v] = to_zero(at.zeros + V::kLanes * (V0 + v));
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) part[r][v] = V::zero();
  }
}

// out[r][kLanes v] = (sum over the group of x * (q - zero)) * factor + out for rows r < R and
// vectors v in [V0, V0 + kVecs).
template <class V, class W, int R, int V0, int kVecs>
void int4_f32_group(const Int4Rows& in, int64_t r0, const Int4Group& at, float* out) {
  using F = typename V::F;
  using I = typename V::I;
  constexpr int kVectors = int(kInt4Cols) / V::kLanes;
  const float* xf = in.xf + r0 * in.ld + at.k0;
  typename W::F32Zero zero[kVecs];
  F part[R][kVecs];
  int4_start<V, R, V0, kVecs>(at, W::f32_zero, zero, part);
  for (int64_t q = 0; q < at.len / 4; ++q) {
    const typename W::Quad quad = W::load(at.codes + q * 64);
    auto input = [&](auto t) {  // input t of the quad, t a std::integral_constant
      I nibbles[kVectors];
      W::template nibbles<decltype(t)::value>(quad, nibbles);
      F wv[kVecs];
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) wv[v] = W::f32_weight(nibbles[V0 + v], zero[v]);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        const F a = V::set1(xf[r * in.ld + 4 * q + decltype(t)::value]);
#pragma GCC unroll 4
        for (int v = 0; v < kVecs; ++v) part[r][v] = V::fmadd(a, wv[v], part[r][v]);
      }
    };
    input(std::integral_constant<int, 0>());
    input(std::integral_constant<int, 1>());
    input(std::integral_constant<int, 2>());
    input(std::integral_constant<int, 3>());
  }
  int4_add_scaled<V, R, V0, kVecs>(part, at, out);
}

// Codes fetched this many bytes ahead of the int8 kernel's loads. On AMD EPYC Zen 5 (AVX-512)
// the hardware prefetchers alone held the 0.6B decode's INT4 weight stream at 30-35 GB/s
// (lm_head alone 49-51) of a 62-66 GB/s read probe; 1 KiB ahead gave 39 (62-65), 4 KiB 33-35.
// The BF16-input kernel is bound by its widening, not by the stream, and goes without.
constexpr int64_t kInt4FetchAhead = 1024;

// The same with int8 inputs in blocks of kA (0: at.A).
template <class V, class W, int R, int V0, int kVecs, int kA>
void int4_int8_group(const Int4Rows& in, int64_t r0, const Int4Group& at, float* out) {
  using F = typename V::F;
  using I = typename V::I;
  constexpr int kVectors = int(kInt4Cols) / V::kLanes;
  const int64_t A = kA ? kA : at.A;
  const int8_t* xq = in.xq + r0 * in.ld + at.k0;
  const int32_t* s = in.s + r0 * in.ldb + at.a0;
  const float* d = in.d + r0 * in.ldb + at.a0;
  typename W::Int8Zero zero[kVecs];
  F part[R][kVecs];
  int4_start<V, R, V0, kVecs>(at, W::int8_zero, zero, part);
  for (int64_t a = 0; a < at.len / A; ++a) {
    I sum[R][kVecs];  // from -zero * s
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) sum[r][v] = W::start(zero[v], W::minus_s(s[r * in.ldb + a]));
#pragma GCC unroll 8
    for (int64_t q = 0; q < A / 4; ++q) {
      const int64_t kk = a * A + 4 * q;
      _mm_prefetch(reinterpret_cast<const char*>(at.codes + kk * 16 + kInt4FetchAhead), _MM_HINT_T0);
      I codes[kVectors];
      W::int8_codes(W::load(at.codes + kk * 16), codes);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, xq + r * in.ld + kk, 4);
        const I x4 = V::set1_i(four);
#pragma GCC unroll 4
        for (int v = 0; v < kVecs; ++v) sum[r][v] = W::dot(sum[r][v], codes[V0 + v], x4);
      }
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const F factor = V::set1(d[r * in.ldb + a]);
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) part[r][v] = V::fmadd(V::to_float(sum[r][v]), factor, part[r][v]);
    }
  }
  int4_add_scaled<V, R, V0, kVecs>(part, at, out);
}

// A whole group of R rows, W::part_vectors(kInt8, R) vectors of columns at a time.
template <class V, class W, bool kInt8, int R, int kA>
void int4_group(const Int4Rows& in, int64_t r0, const Int4Group& at, float* out) {
  constexpr int kVectors = int(kInt4Cols) / V::kLanes, kPart = W::part_vectors(kInt8, R);
  static_assert(kVectors % kPart == 0);
  [&]<int... p>(std::integer_sequence<int, p...>) {
    if constexpr (kInt8)
      (int4_int8_group<V, W, R, p * kPart, kPart, kA>(in, r0, at, out), ...);
    else
      (int4_f32_group<V, W, R, p * kPart, kPart>(in, r0, at, out), ...);
  }(std::make_integer_sequence<int, kVectors / kPart>());
}

// The shared driver's Tier (simd_int4.h) for traits V and codes W.
template <class V, class W>
struct Int4Tier {
  using GroupFn = void (*)(const Int4Rows&, int64_t, const Int4Group&, float*);
  static constexpr int64_t kDecodeRows = 4;

  template <bool kInt8Inputs, int kA, int... R>
  static constexpr std::array<GroupFn, sizeof...(R)> by_rows(std::integer_sequence<int, R...>) {
    return {int4_group<V, W, kInt8Inputs, R + 1, kA>...};
  }
  static constexpr auto kF32 = by_rows<false, 0>(std::make_integer_sequence<int, W::kF32TileRows>());
  static constexpr auto kInt8 = by_rows<true, 32>(std::make_integer_sequence<int, W::kInt8TileRows>());
  static constexpr auto kInt8AnyBlock =
      by_rows<true, 0>(std::make_integer_sequence<int, W::kInt8TileRows>());
  static int64_t tile_rows(const PackedWeights& w) {
    return w.int8_inputs ? W::kInt8TileRows : W::kF32TileRows;
  }
  static void prepare(const bf16* x, int64_t ldx, int64_t rows, const PackedWeights& w,
                      Int4Rows& in) {
    int4_prepare<V>(x, ldx, rows, w, in, W::quantize_32);
  }
  static void run(const Int4Rows& in, int64_t r0, int64_t rows, const PackedWeights& w,
                  int64_t b, float* out) {
    const bool blocks_of_32 = int8_block(w.group) == 32;
    const GroupFn fn = !w.int8_inputs ? kF32[size_t(rows - 1)]
                       : blocks_of_32 ? kInt8[size_t(rows - 1)]
                                      : kInt8AnyBlock[size_t(rows - 1)];
    for_each_group(w, b, [&](const Int4Group& at) { fn(in, r0, at, out); });
  }
};

}  // namespace ellm::simd
