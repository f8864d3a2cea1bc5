// Reference INT4 product (layout and arithmetic in kernels.h): every row the decode way.
// x * (q - zero) is exact in FP32 (8 significant bits times 5), so `part += x * v` rounds only
// the sum, as an FMA does; the factor goes in with std::fma, as the vector tiers' FMA.
#include <algorithm>
#include <cmath>

#include "base/threads.h"
#include "kernels/scalar/scalar.h"

namespace ellm::scalar {

void matmul_int4(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
                 int64_t ldy, bool accumulate, int member, int n_members,
                 std::atomic<int64_t>* pool) {
  const int32_t* order = w.k_order.get();
  share_work((w.n + kInt4Cols - 1) / kInt4Cols, member, n_members, pool, [&](int64_t b0, int64_t b1) {
    for (int64_t i = 0; i < m; ++i) {
      const bf16* xi = x + i * ldx;
      for (int64_t j = b0 * kInt4Cols; j < std::min(w.n, b1 * kInt4Cols); ++j) {
        float sum = accumulate ? y[i * ldy + j] : 0;
        for (int64_t g = 0; g < w.groups; ++g) {
          const float zero = w.zeros[int4_group_index(w, j, g)];
          float part = 0;
          for (int64_t kk = g * w.group; kk < (g + 1) * w.group; ++kk)
            part += bf16_to_f32(xi[order ? order[kk] : kk]) * (float(int4_code(w, j, kk)) - zero);
          sum = std::fma(part, w.scales[int4_group_index(w, j, g)], sum);
        }
        y[i * ldy + j] = sum;
      }
    }
  });
}

}  // namespace ellm::scalar
