// Plain C++ element-wise kernels: the reference the vector versions are tested against.
#include <cmath>

#include "kernels/isa_kernels.h"

namespace ellm::scalar {

void convert_f32_to_bf16(const float* x, bf16* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = f32_to_bf16(x[i]);
}

void convert_bf16_to_f32(const bf16* x, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_f32(x[i]);
}

void rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight,
             float eps, float* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* o = out + r * ldo;
    double sum_sq = 0;
    for (int64_t i = 0; i < dim; ++i) sum_sq += double(xr[i]) * xr[i];
    float inv_rms = 1.0f / std::sqrt(float(sum_sq / dim) + eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv_rms * weight[i];
  }
}

void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const float* inv_freq) {
  int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* xh = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      float angle = float(pos) * inv_freq[i];
      float c = std::cos(angle), s = std::sin(angle);
      float a = xh[i], b = xh[i + half];
      xh[i] = a * c - b * s;
      xh[i + half] = b * c + a * s;
    }
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace ellm::scalar
