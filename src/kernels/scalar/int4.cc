// Reference INT4 products (layout and arithmetic in kernels.h): every row the same way, with x
// as BF16 or quantised to int8.
//
// BF16 x: x * (q - zero) is exact in FP32 (8 significant bits times 5), so `part += x * v`
// rounds only the sum, as an FMA does; the factor goes in with std::fma, as the vector tiers'
// FMA. Int8 x: the block sums are exact integers, then two FMAs as the vector tiers do them.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "base/threads.h"
#include "kernels/scalar/scalar.h"
#include "kernels/simd_int4.h"

namespace ellm::scalar {

namespace {

// Row i of x as FP32 in the weights' input order.
void row_inputs(const bf16* xi, const PackedWeights& w, float* out) {
  const int32_t* order = w.k_order.get();
  for (int64_t kk = 0; kk < w.k; ++kk) out[kk] = bf16_to_f32(xi[order ? order[kk] : kk]);
}

}  // namespace

void matmul_int4(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
                 int64_t ldy, bool accumulate, int member, int n_members,
                 std::atomic<int64_t>* pool) {
  const int64_t k = w.k, G = w.group, A = int8_block(G), blocks = k / A;
  // Per row: the inputs as FP32, then (int8) their codes, factors and sums per block.
  const size_t floats = size_t(k), bytes = floats * sizeof(float) + size_t(k) +
                                           size_t(blocks) * (sizeof(float) + sizeof(int32_t));
  uint8_t* scratch = static_cast<uint8_t*>(thread_scratch(0, size_t(m) * bytes));
  auto xf = [&](int64_t i) { return reinterpret_cast<float*>(scratch + size_t(i) * bytes); };
  auto xq = [&](int64_t i) { return reinterpret_cast<int8_t*>(xf(i) + k); };
  auto xd = [&](int64_t i) { return reinterpret_cast<float*>(xq(i) + k); };
  auto xs = [&](int64_t i) { return reinterpret_cast<int32_t*>(xd(i) + blocks); };
  for (int64_t i = 0; i < m; ++i) {
    row_inputs(x + i * ldx, w, xf(i));
    if (w.int8_inputs)
      for (int64_t a = 0; a < blocks; ++a)
        simd::quantize_int8_block(xf(i) + a * A, A, xq(i) + a * A, xd(i) + a, xs(i) + a);
  }
  share_work((w.n + kInt4Cols - 1) / kInt4Cols, member, n_members, pool, [&](int64_t b0, int64_t b1) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = b0 * kInt4Cols; j < std::min(w.n, b1 * kInt4Cols); ++j) {
        float sum = accumulate ? y[i * ldy + j] : 0;
        for (int64_t g = 0; g < w.groups; ++g) {
          const int zero = w.zeros[int4_group_index(w, j, g)];
          float part = 0;
          if (w.int8_inputs) {
            for (int64_t a = g * G / A; a < (g + 1) * G / A; ++a) {
              int32_t dot = -zero * xs(i)[a];
              for (int64_t kk = a * A; kk < (a + 1) * A; ++kk) dot += xq(i)[kk] * int4_code(w, j, kk);
              part = std::fma(float(dot), xd(i)[a], part);
            }
          } else {
            for (int64_t kk = g * G; kk < (g + 1) * G; ++kk)
              part += xf(i)[kk] * float(int(int4_code(w, j, kk)) - zero);
          }
          sum = std::fma(part, w.scales[int4_group_index(w, j, g)], sum);
        }
        y[i * ldy + j] = sum;
      }
  });
}

}  // namespace ellm::scalar
