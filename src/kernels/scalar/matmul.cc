// Reference matrix product. The packed layout is the checkpoint's own [n][k].
#include <algorithm>
#include <cstring>

#include "base/threads.h"
#include "kernels/scalar/scalar.h"

namespace ellm::scalar {

void pack_weights(const bf16* w, int64_t n, int64_t k, PackedWeights& out) {
  out.bytes = size_t(n * k) * sizeof(bf16);
  out.data = make_buffer<bf16>(size_t(n * k));
  std::memcpy(out.data.get(), w, out.bytes);
}

void matmul(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y, int64_t ldy,
            bool accumulate, int member, int n_members, std::atomic<int64_t>* pool) {
  share_work(w.n, member, n_members, pool, [&](int64_t j0, int64_t j1) {
    for (int64_t i = 0; i < m; ++i) {
      const bf16* xi = x + i * ldx;
      for (int64_t j = j0; j < j1; ++j) {
        const bf16* wj = w.data.get() + j * w.k;
        float sum = 0;
        for (int64_t kk = 0; kk < w.k; ++kk) sum += bf16_to_f32(xi[kk]) * bf16_to_f32(wj[kk]);
        y[i * ldy + j] = accumulate ? y[i * ldy + j] + sum : sum;
      }
    }
  });
}

// Every row the decode way: per 128 k a partial dot product of the widened codes, times the
// block's factor.
void matmul_fp8(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
                int64_t ldy, bool accumulate, int member, int n_members,
                std::atomic<int64_t>* pool) {
  share_work((w.n + kFp8Cols - 1) / kFp8Cols, member, n_members, pool, [&](int64_t b0, int64_t b1) {
    for (int64_t i = 0; i < m; ++i) {
      const bf16* xi = x + i * ldx;
      for (int64_t j = b0 * kFp8Cols; j < std::min(w.n, b1 * kFp8Cols); ++j) {
        float sum = accumulate ? y[i * ldy + j] : 0;
        for (int64_t kb = 0; kb < w.k_blocks; ++kb) {
          float part = 0;
          for (int64_t kk = kb * kFp8BlockK; kk < std::min(w.k, (kb + 1) * kFp8BlockK); ++kk)
            part += bf16_to_f32(xi[kk]) * fp8_e4m3_to_f32(w.codes[fp8_code_index(w, j, kk)]);
          sum += part * w.scales[fp8_scale_index(w, j, kb)];
        }
        y[i * ldy + j] = sum;
      }
    }
  });
}

}  // namespace ellm::scalar
