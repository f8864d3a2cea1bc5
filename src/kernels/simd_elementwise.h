#pragma once
// e^x and the element-wise kernels, written once over a vector-traits type V (kernels/vec_*.h)
// and instantiated by each SIMD tier with its own compile flags (kernels/<tier>/elementwise.cc),
// so the 8- and 16-lane versions are one algorithm. Whole vectors here; a tail shorter than a
// vector is a masked vector where V has masks (V::kMaskedTail), else the scalar twin.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/kernel_table.h"

namespace ellm::simd {

// e^x to ~2 ulp (Cephes expf polynomial) over the whole float range: below -104 the result
// rounds to 0, above 88.8 it is inf, and tiny results go subnormal (V::scale_pow2 rounds once).
template <class V>
inline typename V::F exp(typename V::F x) {
  using F = typename V::F;
  x = V::max(x, V::set1(-104.0f));
  x = V::min(x, V::set1(88.8f));
  F n = V::round_nearest(V::mul(x, V::set1(1.44269504088896341f)));
  F r = V::fnmadd(n, V::set1(0.693359375f), x);
  r = V::fnmadd(n, V::set1(-2.12194440e-4f), r);
  F p = V::set1(1.9875691500e-4f);
  p = V::fmadd(p, r, V::set1(1.3981999507e-3f));
  p = V::fmadd(p, r, V::set1(8.3334519073e-3f));
  p = V::fmadd(p, r, V::set1(4.1665795894e-2f));
  p = V::fmadd(p, r, V::set1(1.6666665459e-1f));
  p = V::fmadd(p, r, V::set1(5.0000001201e-1f));
  p = V::fmadd(p, V::mul(r, r), V::add(r, V::set1(1.0f)));
  return V::scale_pow2(p, n);
}

// Calls body(i, n) for i = 0, L, 2L, ... with n = the elements left (whole vectors, then a masked
// tail where V has masks); returns where the scalar twin must take over.
template <class V, class Body>
inline int64_t for_vectors(int64_t count, Body&& body) {
  constexpr int64_t L = V::kLanes;
  int64_t i = 0;
  for (; i + L <= count; i += L) body(i, L);
  if constexpr (V::kMaskedTail) {
    if (i < count) body(i, count - i);
    return count;
  }
  return i;
}

// Integer round-to-nearest-even, bit-identical to f32_to_bf16 (vcvtneps2bf16 would flush
// denormals).
template <class V>
void convert_f32_to_bf16(const float* x, bf16* out, int64_t count) {
  const auto abs_mask = V::set1_i(0x7fffffff), inf = V::set1_i(0x7f800000);
  int64_t done = for_vectors<V>(count, [&](int64_t i, int64_t n) {
    auto bits = V::bits(V::load(x + i, n));
    auto odd = V::and_i(V::high_half(bits), V::set1_i(1));
    auto rounded = V::high_half(V::add_i(bits, V::add_i(odd, V::set1_i(0x7fff))));
    auto quiet_nan = V::or_i(V::high_half(bits), V::set1_i(0x40));
    auto nan = V::lanes_greater(V::and_i(bits, abs_mask), inf);
    V::store_u16(out + i, V::select_i(nan, rounded, quiet_nan), n);
  });
  scalar_kernels.convert_f32_to_bf16(x + done, out + done, count - done);
}

template <class V>
void convert_bf16_to_f32(const bf16* x, float* out, int64_t count) {
  int64_t done = for_vectors<V>(count, [&](int64_t i, int64_t n) {
    V::store(out + i, V::load_bf16(x + i, n), n);
  });
  scalar_kernels.convert_bf16_to_f32(x + done, out + done, count - done);
}

// Two vectors of codes at a time (V::load_fp8_x2 widens them times 2^-8, exactly); times 2^8,
// exact again, then the one rounding of the scalar twin's product. load_fp8_x2 widens the NaN
// codes to +-1.875, above any finite code's 448 x 2^-8: those lanes become the twin's NaN.
template <class V>
void convert_fp8_e4m3_to_f32(const uint8_t* codes, float scale, float* out, int64_t count) {
  constexpr int64_t L = V::kLanes;
  const auto factor = V::set1(scale), exact_256 = V::set1(256.0f), nan = V::set1(__builtin_nanf(""));
  const auto abs_mask = V::set1_i(0x7fffffff), largest = V::bits(V::set1(448.0f / 256.0f));
  auto finish = [&](typename V::F w, float* o) {
    const auto is_nan = V::lanes_greater(V::and_i(V::bits(w), abs_mask), largest);
    V::store(o, V::select(is_nan, V::mul(V::mul(w, exact_256), factor), nan));
  };
  int64_t i = 0;
  for (; i + 2 * L <= count; i += 2 * L) {
    typename V::F lo, hi;
    V::load_fp8_x2(codes + i, lo, hi);
    finish(lo, out + i);
    finish(hi, out + i + L);
  }
  scalar_kernels.convert_fp8_e4m3_to_f32(codes + i, scale, out + i, count - i);
}

// Saturates first, as f32_to_f16 does; the limit goes first so a NaN passes through min/max.
template <class V>
void convert_f32_to_f16(const float* x, f16* out, int64_t count) {
  const auto limit = V::set1(65504.0f), minus_limit = V::set1(-65504.0f);
  int64_t done = for_vectors<V>(count, [&](int64_t i, int64_t n) {
    V::store_f16(out + i, V::max(minus_limit, V::min(limit, V::load(x + i, n))), n);
  });
  scalar_kernels.convert_f32_to_f16(x + done, out + done, count - done);
}

template <class V>
void rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight,
             float eps, float* out, int64_t ldo) {
  constexpr int64_t L = V::kLanes, A = V::kSumAccumulators;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* o = out + r * ldo;
    typename V::F sum[A];
    for (auto& s : sum) s = V::zero();
    int64_t i = 0;
    for (; i + A * L <= dim; i += A * L)
      for (int64_t a = 0; a < A; ++a) {
        auto v = V::load(xr + i + a * L);
        sum[a] = V::fmadd(v, v, sum[a]);
      }
    i += for_vectors<V>(dim - i, [&](int64_t j, int64_t n) {
      auto v = V::load(xr + i + j, n);
      sum[0] = V::fmadd(v, v, sum[0]);
    });
    for (int64_t a = 1; a < A; ++a) sum[0] = V::add(sum[0], sum[a]);
    float sum_sq = V::hsum(sum[0]);
    for (; i < dim; ++i) sum_sq += xr[i] * xr[i];
    float inv_rms = 1.0f / std::sqrt(sum_sq / float(dim) + eps);
    auto vinv = V::set1(inv_rms);
    i = for_vectors<V>(dim, [&](int64_t j, int64_t n) {
      V::store(o + j, V::mul(V::mul(V::load(xr + j, n), vinv), V::load(weight + j, n)), n);
    });
    for (; i < dim; ++i) o[i] = xr[i] * inv_rms * weight[i];
  }
}

template <class V>
void norm_rope(const float* x, int64_t n_heads, int64_t head_dim, const float* weight, float eps,
               const float* cos, const float* sin, float* out, int64_t ldo) {
  const int64_t half = head_dim / 2;
  if (head_dim % 2 || (!V::kMaskedTail && half % V::kLanes))
    return scalar_kernels.norm_rope(x, n_heads, head_dim, weight, eps, cos, sin, out, ldo);
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* lo = x + h * head_dim;
    const float* hi = lo + half;
    auto sum = V::zero();
    for_vectors<V>(head_dim, [&](int64_t i, int64_t n) {
      auto v = V::load(lo + i, n);
      sum = V::fmadd(v, v, sum);
    });
    auto inv_rms = V::set1(1.0f / std::sqrt(V::hsum(sum) / float(head_dim) + eps));
    float* o = out + h * ldo;
    for_vectors<V>(half, [&](int64_t i, int64_t n) {
      auto a = V::mul(V::mul(V::load(lo + i, n), inv_rms), V::load(weight + i, n));
      auto b = V::mul(V::mul(V::load(hi + i, n), inv_rms), V::load(weight + half + i, n));
      auto c = V::load(cos + i, n), s = V::load(sin + i, n);
      V::store(o + i, V::fmsub(a, c, V::mul(b, s)), n);
      V::store(o + half + i, V::fmadd(b, c, V::mul(a, s)), n);
    });
  }
}

template <class V>
void silu_mul(const float* gate, const float* up, float* out, int64_t count) {
  const auto one = V::set1(1.0f);
  int64_t done = for_vectors<V>(count, [&](int64_t i, int64_t n) {
    auto g = V::load(gate + i, n);
    auto silu = V::div(g, V::add(one, exp<V>(V::sub(V::zero(), g))));
    V::store(out + i, V::mul(silu, V::load(up + i, n)), n);
  });
  scalar_kernels.silu_mul(gate + done, up + done, out + done, count - done);
}

template <class V>
float softmax_exp(float* x, int64_t count, float scale) {
  auto top_lanes = V::set1(x[0]);
  const int64_t whole = for_vectors<V>(count, [&](int64_t i, int64_t n) {
    top_lanes = V::max_first(top_lanes, V::load(x + i, n), n);
  });
  float top = V::hmax(top_lanes);
  for (int64_t i = whole; i < count; ++i) top = std::max(top, x[i]);
  const auto shift = V::set1(top), factor = V::set1(scale);
  auto sum_lanes = V::zero();
  const int64_t done = for_vectors<V>(count, [&](int64_t i, int64_t n) {
    auto e = exp<V>(V::mul(V::sub(V::load(x + i, n), shift), factor));
    V::store(x + i, e, n);
    sum_lanes = V::add(sum_lanes, V::zero_unless(V::first_lanes(n), e));
  });
  float sum = V::hsum(sum_lanes);
  for (int64_t i = done; i < count; ++i) sum += x[i] = std::exp((x[i] - top) * scale);
  return sum;
}

// 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)): one exp, no cancellation for negative x.
template <class V>
void gelu_tanh(const float* x, float* out, int64_t count) {
  const auto one = V::set1(1.0f), cubic = V::set1(0.044715f);
  const auto minus_two_root = V::set1(-2.0f * 0.7978845608028654f);
  int64_t done = for_vectors<V>(count, [&](int64_t i, int64_t n) {
    auto v = V::load(x + i, n);
    auto u = V::fmadd(V::mul(cubic, V::mul(v, v)), v, v);  // x + 0.044715 x^3
    V::store(out + i, V::div(v, V::add(one, exp<V>(V::mul(minus_two_root, u)))), n);
  });
  scalar_kernels.gelu_tanh(x + done, out + done, count - done);
}

// kDotLanes lanes in kDotLanes / L vectors. Tiles of up to 4 rows of w by 4 / (kDotLanes / L) rows
// of x (16 accumulators) over chunks of 64 x rows, so a tile of w is read from memory once per
// chunk (a router's weights are megabytes, read per token otherwise). The tail and the lanes' tree
// are the scalar twin's. `weights` gives row r's handle for the 128 inputs from i0
// (block(r, i0)), the vector at input i from it (load(handle, i)), and finishes a row's dot from
// its lanes (finish(lanes, x row, r, from)).
template <class V, int NR, int NT, class Weights>
inline void dot_rows_tile(const float* x, int64_t ldx, const Weights& weights, int64_t r0, int64_t whole,
                          int64_t dim, float* out, int64_t ldo) {
  constexpr int64_t L = V::kLanes, A = kDotLanes / L;
  // Every loop has a constant count and is unrolled, so the accumulators stay in registers.
  typename V::F acc[NT][NR][A];
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 16
      for (int a = 0; a < A; ++a) acc[t][r][a] = V::zero();
  for (int64_t i0 = 0; i0 < whole; i0 += kDotBlock) {
    const int64_t i1 = whole - i0 < kDotBlock ? whole : i0 + kDotBlock;
    typename Weights::Block rows[NR];
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) rows[r] = weights.block(r0 + r, i0);
    for (int64_t i = i0; i < i1; i += kDotLanes)
#pragma GCC unroll 16
      for (int a = 0; a < A; ++a) {
        typename V::F wv[NR];
#pragma GCC unroll 16
        for (int r = 0; r < NR; ++r) wv[r] = weights.load(rows[r], i + a * L);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) {
          const auto xv = V::load(x + t * ldx + i + a * L);
#pragma GCC unroll 16
          for (int r = 0; r < NR; ++r) acc[t][r][a] = V::fmadd(xv, wv[r], acc[t][r][a]);
        }
      }
  }
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) {
      static_assert(A == 1 || A == 2);
      if (whole == dim) {  // V::hsum folds in halves, as fold_dot_lanes does
        out[t * ldo + r] = V::hsum(A == 1 ? acc[t][r][0] : V::add(acc[t][r][0], acc[t][r][A - 1]));
        continue;
      }
      float lanes[kDotLanes];
#pragma GCC unroll 16
      for (int a = 0; a < A; ++a) V::store(lanes + a * L, acc[t][r][a]);
      out[t * ldo + r] = weights.finish(lanes, x + t * ldx, r0 + r, whole);
    }
}

template <class V, class Weights>
void dot_rows_tiles(const float* x, int64_t m, int64_t ldx, const Weights& weights, int64_t rows,
                    int64_t dim, float* out, int64_t ldo) {
  constexpr int R = 4, T = int(4 / (kDotLanes / V::kLanes));
  static_assert(T == 2 || T == 4);
  using TileFn = void(const float*, int64_t, const Weights&, int64_t, int64_t, int64_t, float*, int64_t);
  constexpr TileFn* tiles[R][4] = {
      {dot_rows_tile<V, 1, 1, Weights>, dot_rows_tile<V, 1, 2, Weights>, dot_rows_tile<V, 1, 3, Weights>,
       dot_rows_tile<V, 1, 4, Weights>},
      {dot_rows_tile<V, 2, 1, Weights>, dot_rows_tile<V, 2, 2, Weights>, dot_rows_tile<V, 2, 3, Weights>,
       dot_rows_tile<V, 2, 4, Weights>},
      {dot_rows_tile<V, 3, 1, Weights>, dot_rows_tile<V, 3, 2, Weights>, dot_rows_tile<V, 3, 3, Weights>,
       dot_rows_tile<V, 3, 4, Weights>},
      {dot_rows_tile<V, 4, 1, Weights>, dot_rows_tile<V, 4, 2, Weights>, dot_rows_tile<V, 4, 3, Weights>,
       dot_rows_tile<V, 4, 4, Weights>}};
  constexpr int64_t kChunk = 64;
  const int64_t whole = dim / kDotLanes * kDotLanes;
  for (int64_t c0 = 0; c0 < m; c0 += kChunk) {
    const int64_t c1 = c0 + kChunk < m ? c0 + kChunk : m;
    for (int64_t r0 = 0; r0 < rows; r0 += R) {
      const int64_t nr = rows - r0 < R ? rows - r0 : R;
      for (int64_t t0 = c0; t0 < c1; t0 += T) {
        const int64_t nt = c1 - t0 < T ? c1 - t0 : T;
        tiles[nr - 1][nt - 1](x + t0 * ldx, ldx, weights, r0, whole, dim, out + t0 * ldo + r0, ldo);
      }
    }
  }
}

template <class V>
void dot_rows_f32(const float* x, int64_t m, int64_t ldx, const float* w, int64_t rows, int64_t dim,
                  float* out, int64_t ldo) {
  struct {
    using Block = const float*;
    const float* w;
    int64_t dim;
    // No software prefetch: 4 KiB ahead, it slowed these FP32 rows' cold reads by 10-25% (Zen 5).
    Block block(int64_t r, int64_t) const { return w + r * dim; }
    typename V::F load(Block row, int64_t i) const { return V::load(row + i); }
    float finish(float* lanes, const float* x, int64_t r, int64_t from) const {
      return finish_dot_lanes(lanes, x, w + r * dim, from, dim);
    }
  } weights{w, dim};
  dot_rows_tiles<V>(x, m, ldx, weights, rows, dim, out, ldo);
}

// The same over E4M3 codes: each vector of weights widened in registers as
// convert_fp8_e4m3_to_f32 widens it: the codes' values times 2^-8 exactly, then one product with
// the block's factor times 2^8 (exact), which rounds as code x factor does.
template <class V>
void dot_rows_fp8(const float* x, int64_t m, int64_t ldx, const uint8_t* codes, const float* factors,
                  int64_t row0, int64_t rows, int64_t dim, float* out, int64_t ldo) {
  static_assert(kFp8BlockK == kDotBlock);
  // A tile reads 4 rows side by side, 16 codes at a time: the hardware's prefetch alone ran
  // these products at 10-12 GB/s a core (Zen 5), 15-20 with each block's lines asked for early.
  constexpr int64_t kPrefetchBytes = 2048;
  struct Block {
    const uint8_t* codes;  // the row's codes
    typename V::F factor;  // its block's factor x 2^8
  };
  struct {
    using Block = struct Block;
    const uint8_t* codes;
    const float* factors;
    int64_t row0, dim, blocks;
    const float* row_factors(int64_t r) const { return factors + (row0 + r) / kFp8BlockK * blocks; }
    Block block(int64_t r, int64_t i0) const {
      const uint8_t* row = codes + r * dim;
      __builtin_prefetch(row + i0 + kPrefetchBytes);
      __builtin_prefetch(row + i0 + kPrefetchBytes + 64);
      return {row, V::set1(row_factors(r)[i0 / kFp8BlockK] * 256.0f)};
    }
    typename V::F load(const Block& row, int64_t i) const { return V::mul(V::load_fp8(row.codes + i), row.factor); }
    float finish(float* lanes, const float* x, int64_t r, int64_t from) const {
      return finish_dot_lanes_fp8(lanes, x, codes + r * dim, row_factors(r), from, dim);
    }
  } weights{codes, factors, row0, dim, (dim + kFp8BlockK - 1) / kFp8BlockK};
  dot_rows_tiles<V>(x, m, ldx, weights, rows, dim, out, ldo);
}

}  // namespace ellm::simd
