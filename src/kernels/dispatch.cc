// Entry points of kernels.h: pick the implementation for the active instruction set. The amx
// tier has its own matrix product and runs the AVX-512 BF16 kernels for everything else.
#include <cmath>

#include "base/error.h"
#include "kernels/isa_kernels.h"

namespace ellm {

#define ELLM_DISPATCH(isa, call)          \
  switch (isa) {                          \
    case Isa::scalar: return scalar::call; \
    case Isa::avx2: return avx2::call;     \
    case Isa::avx512:                     \
    case Isa::amx: return avx512::call;   \
  }

void convert_f32_to_bf16(const float* x, bf16* out, int64_t count) {
  ELLM_DISPATCH(active_isa(), convert_f32_to_bf16(x, out, count));
}

void convert_bf16_to_f32(const bf16* x, float* out, int64_t count) {
  ELLM_DISPATCH(active_isa(), convert_bf16_to_f32(x, out, count));
}

void convert_f32_to_f16(const float* x, f16* out, int64_t count) {
  ELLM_DISPATCH(active_isa(), convert_f32_to_f16(x, out, count));
}

void rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight, float eps,
             float* out, int64_t ldo) {
  ELLM_DISPATCH(active_isa(), rmsnorm(x, rows, dim, ldx, weight, eps, out, ldo));
}

void rope_angles(int64_t pos, const float* inv_freq, int64_t half, float* cos, float* sin) {
  for (int64_t i = 0; i < half; ++i) {
    float angle = float(pos) * inv_freq[i];
    cos[i] = std::cos(angle);
    sin[i] = std::sin(angle);
  }
}

void norm_rope(const float* x, int64_t n_heads, int64_t head_dim, const float* weight, float eps,
               const float* cos, const float* sin, float* out, int64_t ldo) {
  ELLM_DISPATCH(active_isa(), norm_rope(x, n_heads, head_dim, weight, eps, cos, sin, out, ldo));
}

void silu_mul(const float* gate, const float* up, float* out, int64_t count) {
  ELLM_DISPATCH(active_isa(), silu_mul(gate, up, out, count));
}

PackedWeights pack_weights(const bf16* w, int64_t n, int64_t k, Isa isa) {
  if (n <= 0 || k <= 0)
    fail("pack_weights", "empty weight matrix " + std::to_string(n) + "x" + std::to_string(k));
  PackedWeights out;
  out.n = n;
  out.k = k;
  out.isa = isa;
  switch (isa) {
    case Isa::scalar: scalar::pack_weights(w, n, k, out); break;
    case Isa::avx2: avx2::pack_weights(w, n, k, out); break;
    case Isa::avx512:
    case Isa::amx: avx512::pack_weights(w, n, k, out); break;
  }
  return out;
}

// Weights are packed for one instruction set, so the matrix, not active_isa(), decides.
void matmul(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y, int64_t ldy,
            bool accumulate, int member, int n_members, std::atomic<int64_t>* pool) {
  if (m <= 0) return;
  if (w.isa == Isa::amx) return amx::matmul(x, m, ldx, w, y, ldy, accumulate, member, n_members, pool);
  ELLM_DISPATCH(w.isa, matmul(x, m, ldx, w, y, ldy, accumulate, member, n_members, pool));
}

#undef ELLM_DISPATCH

}  // namespace ellm
