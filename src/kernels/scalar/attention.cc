// Reference flash-attention step (contract in kernel_table.h).
#include <algorithm>
#include <cmath>

#include "kernels/scalar/scalar.h"

namespace ellm::scalar {
namespace {

// attention_block for p1 - p0 <= 64.
void block(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
           const f16* k, const f16* v, int64_t ldkv, int64_t p0, int64_t p1, int64_t head_dim,
           float scale, float* m, float* l, float* acc, float* s) {
  int64_t width = p1 - p0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t visible = std::min(p1, first_end + r / group) - p0;  // positions this row may see
    if (visible <= 0) continue;
    const float* qr = q + (r / group) * ldq + (r % group) * head_dim;
    float* sr = s + r * width;
    float block_max = -INFINITY;
    for (int64_t j = 0; j < visible; ++j) {
      const f16* kj = k + (p0 + j) * ldkv;
      float dot = 0;
      for (int64_t d = 0; d < head_dim; ++d) dot += qr[d] * f16_to_f32(kj[d]);
      sr[j] = dot * scale;
      block_max = std::max(block_max, sr[j]);
    }
    float new_max = std::max(m[r], block_max);
    float correction = std::exp(m[r] - new_max);  // 0 on the first block (m = -inf)
    float* ar = acc + r * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) ar[d] *= correction;
    float sum = 0;
    for (int64_t j = 0; j < visible; ++j) {
      float p = std::exp(sr[j] - new_max);
      sum += p;
      const f16* vj = v + (p0 + j) * ldkv;
      for (int64_t d = 0; d < head_dim; ++d) ar[d] += p * f16_to_f32(vj[d]);
    }
    l[r] = l[r] * correction + sum;
    m[r] = new_max;
  }
}

}  // namespace

void attention_block(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
                     const f16* k, const f16* v, int64_t ldkv, int64_t p0, int64_t p1,
                     int64_t head_dim, float scale, float* m, float* l, float* acc, float* s) {
  for (int64_t p = p0; p < p1; p += 64)
    block(q, ldq, group, rows, first_end, k, v, ldkv, p, std::min(p1, p + 64), head_dim, scale, m,
          l, acc, s);
}

void attention_block_all_heads(const float* q, int64_t ldq, int64_t n_kv_heads, int64_t group,
                               int64_t rows, int64_t first_end, const f16* k, const f16* v,
                               int64_t ldkv, int64_t p0, int64_t p1, int64_t head_dim, float scale,
                               float* m, float* l, float* acc, float* s) {
  for (int64_t p = p0; p < p1; p += 64)
    for (int64_t h = 0; h < n_kv_heads; ++h)
      attention_block(q + h * group * head_dim, ldq, group, rows, first_end, k + h * head_dim,
                      v + h * head_dim, ldkv, p, std::min(p1, p + 64), head_dim, scale, m + h * rows,
                      l + h * rows, acc + h * rows * head_dim, s);
}

}  // namespace ellm::scalar
