#pragma once
// The FP8 decode product, written once over vector traits V (vec_avx2.h, vec_avx512.h) for the
// packed FP8 layout of kernels.h: columns in blocks of 32, each k's 32 codes side by side, one
// factor per block and 128 k.
//
// A member streams its blocks front to back. Per block and 128 k, each row's partial dot
// product runs over the codes widened in registers (V::load_fp8_x2, or the cheaper
// V::load_fp8_x2_normal where the block has no exponent-0 code: the values times 2^-8, exactly), then out = partial * (factor * 2^8) + out, once per 128 k. The x rows are widened to
// FP32 once per call into the thread's scratch.
#include <algorithm>
#include <atomic>

#include "base/threads.h"
#include "kernels/kernel_table.h"
#include "kernels/simd_elementwise.h"

namespace ellm::simd {

constexpr int64_t kFp8DecodeRows = 4;

// out[R][32] += (xf[R][len] . codes[len][32]) * scale, xf rows ldxf apart; codes at the block's
// first k of this 128.
template <class V, int R, bool kNormal>
inline void fp8_block_rows(const float* xf, int64_t ldxf, const uint8_t* codes, int64_t len,
                           float scale, float* out) {
  using F = typename V::F;
  constexpr int kVectors = int(kFp8Cols) / V::kLanes;
  // Every loop unrolled, so the partial sums stay in registers.
  F partial[R][kVectors];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < kVectors; ++v) partial[r][v] = V::zero();
  for (int64_t kk = 0; kk < len; ++kk) {
    F w[kVectors];
#pragma GCC unroll 8
    for (int v = 0; v < kVectors; v += 2)
      if constexpr (kNormal)
        V::load_fp8_x2_normal(codes + kk * kFp8Cols + v * V::kLanes, w[v], w[v + 1]);
      else
        V::load_fp8_x2(codes + kk * kFp8Cols + v * V::kLanes, w[v], w[v + 1]);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      F a = V::set1(xf[r * ldxf + kk]);
#pragma GCC unroll 8
      for (int v = 0; v < kVectors; ++v) partial[r][v] = V::fmadd(a, w[v], partial[r][v]);
    }
  }
  const F factor = V::set1(scale * 256.0f);  // the codes were widened times 2^-8
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < kVectors; ++v) {
      float* o = out + r * kFp8Cols + v * V::kLanes;
      V::store(o, V::fmadd(partial[r][v], factor, V::load(o)));
    }
}

// MatmulFn for FP8 weights and m <= kFp8DecodeRows rows.
template <class V>
void matmul_fp8(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
                int64_t ldy, bool accumulate, int member, int n_members,
                std::atomic<int64_t>* pool) {
  const int64_t k = w.k, blocks = (w.n + kFp8Cols - 1) / kFp8Cols;
  float* xf = static_cast<float*>(thread_scratch(0, size_t(m * k) * sizeof(float)));
  for (int64_t r = 0; r < m; ++r) convert_bf16_to_f32<V>(x + r * ldx, xf + r * k, k);
  share_work(blocks, member, n_members, pool, [&](int64_t b0, int64_t b1) {
    alignas(64) float out[kFp8DecodeRows * kFp8Cols];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t cols = std::min(kFp8Cols, w.n - b * kFp8Cols);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < kFp8Cols; ++c)
          out[r * kFp8Cols + c] = accumulate && c < cols ? y[r * ldy + b * kFp8Cols + c] : 0;
      const uint8_t* codes = w.codes.get() + b * k * kFp8Cols;
      const float* scales = w.scales.get() + b * w.k_blocks;
      for (int64_t kb = 0; kb < w.k_blocks; ++kb) {
        const int64_t k0 = kb * kFp8BlockK, len = std::min(kFp8BlockK, k - k0);
        const bool normal = !w.exponent0_blocks[b * w.k_blocks + kb];
        for (int64_t r = 0; r < m; r += 2) {
          const float* xr = xf + r * k + k0;
          auto* rows = r + 1 < m ? (normal ? fp8_block_rows<V, 2, true> : fp8_block_rows<V, 2, false>)
                                 : (normal ? fp8_block_rows<V, 1, true> : fp8_block_rows<V, 1, false>);
          rows(xr, k, codes + k0 * kFp8Cols, len, scales[kb], out + r * kFp8Cols);
        }
      }
      for (int64_t r = 0; r < m; ++r)
        std::copy_n(out + r * kFp8Cols, cols, y + r * ldy + b * kFp8Cols);
    }
  });
}

}  // namespace ellm::simd
