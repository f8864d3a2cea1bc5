// Plain C++ element-wise kernels: the reference the vector versions are tested against.
#include <algorithm>
#include <cmath>

#include "kernels/scalar/scalar.h"

namespace ellm::scalar {

void convert_f32_to_bf16(const float* x, bf16* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = f32_to_bf16(x[i]);
}

void convert_bf16_to_f32(const bf16* x, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_f32(x[i]);
}

void convert_fp8_e4m3_to_f32(const uint8_t* codes, float scale, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = fp8_e4m3_to_f32(codes[i]) * scale;
}

void convert_f32_to_f16(const float* x, f16* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = f32_to_f16(x[i]);
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

void norm_rope(const float* x, int64_t n_heads, int64_t head_dim, const float* weight, float eps,
               const float* cos, const float* sin, float* out, int64_t ldo) {
  int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* xh = x + h * head_dim;
    float* o = out + h * ldo;
    double sum_sq = 0;
    for (int64_t i = 0; i < head_dim; ++i) sum_sq += double(xh[i]) * xh[i];
    float inv_rms = 1.0f / std::sqrt(float(sum_sq / head_dim) + eps);
    for (int64_t i = 0; i < half; ++i) {  // both reads before both writes: out may be x
      float a = xh[i] * inv_rms * weight[i], b = xh[i + half] * inv_rms * weight[i + half];
      o[i] = a * cos[i] - b * sin[i];
      o[i + half] = b * cos[i] + a * sin[i];
    }
    if (head_dim % 2) o[head_dim - 1] = xh[head_dim - 1] * inv_rms * weight[head_dim - 1];
  }
}

void rope_partial(float* x, int64_t n_heads, int64_t ldx, int64_t rotary_dim, const float* cos,
                  const float* sin) {
  const int64_t half = rotary_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* xh = x + h * ldx;
    for (int64_t i = 0; i < half; ++i) {
      float a = xh[i], b = xh[i + half];
      xh[i] = a * cos[i] - b * sin[i];
      xh[i + half] = b * cos[i] + a * sin[i];
    }
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

float softmax_exp(float* x, int64_t count, float scale) {
  float top = x[0], sum = 0;
  for (int64_t i = 1; i < count; ++i) top = std::max(top, x[i]);
  for (int64_t i = 0; i < count; ++i) sum += x[i] = std::exp((x[i] - top) * scale);
  return sum;
}

void gelu_tanh(const float* x, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float v = x[i];
    out[i] = 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
  }
}

void dot_rows_fp8(const float* x, int64_t m, int64_t ldx, const uint8_t* codes, const float* factors,
                  int64_t row0, int64_t rows, int64_t dim, float* out, int64_t ldo) {
  const int64_t blocks = (dim + kFp8BlockK - 1) / kFp8BlockK;
  for (int64_t t = 0; t < m; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      float lanes[kDotLanes] = {};
      out[t * ldo + r] = finish_dot_lanes_fp8(lanes, x + t * ldx, codes + r * dim,
                                              factors + (row0 + r) / kFp8BlockK * blocks, 0, dim);
    }
}

void dot_rows_f32(const float* x, int64_t m, int64_t ldx, const float* w, int64_t rows, int64_t dim,
                  float* out, int64_t ldo) {
  for (int64_t t = 0; t < m; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      float lanes[kDotLanes] = {};
      out[t * ldo + r] = finish_dot_lanes(lanes, x + t * ldx, w + r * dim, 0, dim);
    }
}

}  // namespace ellm::scalar
