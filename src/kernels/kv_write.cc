// write_kv_row (kernels.h): one position's K or V into a cache row of any KV dtype.
#include <algorithm>
#include <cmath>

#include "kernels/kv_rows.h"

namespace ellm {
namespace {

constexpr float kFp16Max = 65504.0f, kFp8Max = 448.0f;

// One head of FP8: its factor, then its codes.
void write_fp8_head(const float* x, int64_t head_dim, uint8_t* codes, float& factor) {
  float amax = 0.0f;
  for (int64_t d = 0; d < head_dim; ++d) amax = std::max(amax, std::fabs(x[d]));  // NaN: ignored
  amax = std::min(amax, kFp16Max);  // also infinity
  factor = amax / kFp8Max;
  if (factor == 0.0f) {
    std::fill_n(codes, head_dim, uint8_t(0));
    return;
  }
  for (int64_t d = 0; d < head_dim; ++d)
    codes[d] = std::isnan(x[d]) ? 0 : f32_to_fp8_e4m3(x[d] / factor);  // saturates at +-448
}

// One head of int8: its factor, then its codes.
void write_int8_head(const float* x, int64_t head_dim, uint8_t* codes, float& factor) {
  float amax = 0.0f;
  for (int64_t d = 0; d < head_dim; ++d) amax = std::max(amax, std::fabs(x[d]));  // NaN: ignored
  amax = std::min(amax, kFp16Max);
  factor = amax / 127.0f;
  for (int64_t d = 0; d < head_dim; ++d) {
    const float q = factor == 0.0f || std::isnan(x[d]) ? 0.0f : std::nearbyint(x[d] / factor);
    codes[d] = uint8_t(int8_t(std::clamp(q, -127.0f, 127.0f)));
  }
}

}  // namespace

void write_kv_row(const float* x, int64_t n_kv_heads, int64_t head_dim, KvDtype dtype, void* row) {
  const int64_t n = n_kv_heads * head_dim;
  if (dtype == KvDtype::f16) return convert_f32_to_f16(x, static_cast<f16*>(row), n);
  if (dtype == KvDtype::bf16) return convert_f32_to_bf16(x, static_cast<bf16*>(row), n);
  uint8_t* codes = static_cast<uint8_t*>(row);
  float* factors = reinterpret_cast<float*>(codes + n);
  for (int64_t h = 0; h < n_kv_heads; ++h)
    (dtype == KvDtype::fp8 ? write_fp8_head : write_int8_head)(x + h * head_dim, head_dim,
                                                                codes + h * head_dim, factors[h]);
}

}  // namespace ellm
