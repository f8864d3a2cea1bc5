// Reference matrix product. The packed layout is the checkpoint's own [n][k].
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

}  // namespace ellm::scalar
