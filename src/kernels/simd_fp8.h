#pragma once
// The FP8 decode product over vector traits V for the packed FP8 layout of kernels.h (used by
// AVX2; AVX-512 has its own on vdpbf16ps, the arithmetic of its BF16 prefill tiles): columns in blocks of 32, each k's 32 codes side by side, one
// factor per block and 128 k.
//
// A member streams its blocks front to back. Per block and 128 k, each row's partial dot
// product runs over the codes widened in registers (V::load_fp8_x2: the values times 2^-8,
// exactly), then out = partial * (factor * 2^8) + out, once per 128 k. The x rows are widened to
// FP32 once per call into the thread's scratch.
#include <algorithm>
#include <atomic>

#include "base/threads.h"
#include "kernels/kernel_table.h"
#include "kernels/simd_elementwise.h"

namespace ellm::simd {

constexpr int64_t kFp8DecodeRows = 4;

// For rows r < R, over kVecs vectors of columns from `codes` on: out[r][cols] += (xf[r][len] .
// codes[len][cols]) * factor; xf rows ldxf apart, out rows 32 floats apart. codes at this 128's
// first k. Every code is widened once per call, for all R rows; the R x kVecs partial sums must
// fit in registers (fp8_rows).
template <class V, int R, int kVecs>
inline void fp8_tile(const float* xf, int64_t ldxf, const uint8_t* codes, int64_t len,
                     float factor, float* out) {
  using F = typename V::F;
  // Every loop unrolled, so the partial sums stay in registers.
  F partial[R][kVecs];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < kVecs; ++v) partial[r][v] = V::zero();
  for (int64_t kk = 0; kk < len; ++kk) {
    F w[kVecs];
    const uint8_t* c = codes + kk * kFp8Cols;
#pragma GCC unroll 8
    for (int v = 0; v < kVecs; v += 2) V::load_fp8_x2(c + v * V::kLanes, w[v], w[v + 1]);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      F a = V::set1(xf[r * ldxf + kk]);
#pragma GCC unroll 8
      for (int v = 0; v < kVecs; ++v) partial[r][v] = V::fmadd(a, w[v], partial[r][v]);
    }
  }
  const F scale = V::set1(factor * 256.0f);  // the codes were widened times 2^-8
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < kVecs; ++v) {
      float* o = out + r * kFp8Cols + v * V::kLanes;
      V::store(o, V::fmadd(partial[r][v], scale, V::load(o)));
    }
}

// One block of 32 columns for R rows: in parts of columns narrow enough that R rows' partial sums
// stay in registers (on AVX2, 4 rows take the block in 2 halves of 16 columns).
template <class V, int R>
void fp8_rows(const float* xf, int64_t ldxf, const uint8_t* codes, int64_t len, float factor,
              float* out) {
  constexpr int kVectors = int(kFp8Cols) / V::kLanes;
  constexpr int kPart = R * kVectors <= 8 ? kVectors : 2;
  for (int v0 = 0; v0 < kVectors; v0 += kPart)
    fp8_tile<V, R, kPart>(xf, ldxf, codes + v0 * V::kLanes, len, factor, out + v0 * V::kLanes);
}

// MatmulFn for FP8 weights and m <= kFp8DecodeRows rows.
template <class V>
void matmul_fp8(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
                int64_t ldy, bool accumulate, int member, int n_members,
                std::atomic<int64_t>* pool) {
  const int64_t k = w.k, blocks = (w.n + kFp8Cols - 1) / kFp8Cols;
  float* xf = static_cast<float*>(thread_scratch(0, size_t(m * k) * sizeof(float)));
  for (int64_t r = 0; r < m; ++r) convert_bf16_to_f32<V>(x + r * ldx, xf + r * k, k);
  // One block at a time, also for one row: a member's codes are one stream front to back (two
  // blocks at once, 8 FMA chains for one row, read two streams 16 KiB apart, and on AMD EPYC
  // Zen 5's AVX2 tier that ran the 0.6B decode's weights at 23 GB/s against 28-30).
  share_work(blocks, member, n_members, pool, [&](int64_t b0, int64_t b1) {
    alignas(64) float out[kFp8DecodeRows * kFp8Cols];  // [row][32]
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t cols = std::min(kFp8Cols, w.n - b * kFp8Cols);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < kFp8Cols; ++c)
          out[r * kFp8Cols + c] = accumulate && c < cols ? y[r * ldy + b * kFp8Cols + c] : 0;
      const uint8_t* codes = w.codes.get() + b * k * kFp8Cols;
      for (int64_t kb = 0; kb < w.k_blocks; ++kb) {
        const int64_t k0 = kb * kFp8BlockK, len = std::min(kFp8BlockK, k - k0);
        constexpr decltype(&fp8_rows<V, 1>) by_rows[] = {fp8_rows<V, 1>, fp8_rows<V, 2>,
                                                        fp8_rows<V, 3>, fp8_rows<V, 4>};
        by_rows[m - 1](xf + k0, k, codes + k0 * kFp8Cols, len, w.scales[b * w.k_blocks + kb], out);
      }
      for (int64_t r = 0; r < m; ++r)
        std::copy_n(out + r * kFp8Cols, cols, y + r * ldy + b * kFp8Cols);
    }
  });
}

}  // namespace ellm::simd
