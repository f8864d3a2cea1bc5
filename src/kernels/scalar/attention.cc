// Reference flash-attention step (contract in kernel_table.h), for each KV dtype.
#include <algorithm>
#include <cmath>

#include "kernels/scalar/scalar.h"

namespace ellm::scalar {
namespace {

template <KvDtype D>
float element(const void* row, int64_t d) {
  if constexpr (D == KvDtype::f16) return f16_to_f32(static_cast<const f16*>(row)[d]);
  else if constexpr (D == KvDtype::bf16) return bf16_to_f32(static_cast<const bf16*>(row)[d]);
  else if constexpr (D == KvDtype::fp8) return fp8_e4m3_to_f32(static_cast<const uint8_t*>(row)[d]);
  else return float(static_cast<const int8_t*>(row)[d]);
}

// Position p's row of a head, and (FP8) its factor.
template <KvDtype D>
const void* row_at(const void* base, int64_t ldkv, int64_t p) {
  return static_cast<const uint8_t*>(base) + size_t(p * ldkv) * kv_element_bytes(D);
}
inline float factor_at(const float* factors, int64_t ldkv, int64_t p) {
  return *reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(factors) + p * ldkv);
}

// attention_block for p1 - p0 <= 64.
template <KvDtype D>
void block(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
           const void* k, const void* v, const float* kf, const float* vf, int64_t ldkv,
           int64_t p0, int64_t p1, int64_t head_dim, float scale, float* m, float* l, float* acc,
           float* s) {
  int64_t width = p1 - p0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t visible = std::min(p1, first_end + r / group) - p0;  // positions this row may see
    if (visible <= 0) continue;
    const float* qr = q + (r / group) * ldq + (r % group) * head_dim;
    float* sr = s + r * width;
    float block_max = -INFINITY;
    for (int64_t j = 0; j < visible; ++j) {
      const void* kj = row_at<D>(k, ldkv, p0 + j);
      float dot = 0;
      for (int64_t d = 0; d < head_dim; ++d) dot += qr[d] * element<D>(kj, d);
      if constexpr (D == KvDtype::fp8 || D == KvDtype::int8) dot *= factor_at(kf, ldkv, p0 + j);
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
      if constexpr (D == KvDtype::fp8 || D == KvDtype::int8) p *= factor_at(vf, ldkv, p0 + j);
      const void* vj = row_at<D>(v, ldkv, p0 + j);
      for (int64_t d = 0; d < head_dim; ++d) ar[d] += p * element<D>(vj, d);
    }
    l[r] = l[r] * correction + sum;
    m[r] = new_max;
  }
}

}  // namespace

template <KvDtype D>
void attention_block_of(const float* q, int64_t ldq, int64_t group, int64_t rows,
                        int64_t first_end, const void* k, const void* v, const float* kf,
                        const float* vf, int64_t ldkv, int64_t p0, int64_t p1, int64_t head_dim,
                        float scale, float* m, float* l, float* acc, float* s) {
  for (int64_t p = p0; p < p1; p += 64)
    block<D>(q, ldq, group, rows, first_end, k, v, kf, vf, ldkv, p, std::min(p1, p + 64),
             head_dim, scale, m, l, acc, s);
}

template <KvDtype D>
void all_heads_of(const float* q, int64_t ldq, int64_t n_kv_heads, int64_t group, int64_t rows,
                  int64_t first_end, const void* k, const void* v, const float* kf,
                  const float* vf, int64_t ldkv, int64_t p0, int64_t p1, int64_t head_dim,
                  float scale, float* m, float* l, float* acc, float* s) {
  const size_t head_bytes = size_t(head_dim) * kv_element_bytes(D);
  for (int64_t p = p0; p < p1; p += 64)
    for (int64_t h = 0; h < n_kv_heads; ++h)
      attention_block_of<D>(q + h * group * head_dim, ldq, group, rows, first_end,
                            static_cast<const uint8_t*>(k) + h * head_bytes,
                            static_cast<const uint8_t*>(v) + h * head_bytes, kf ? kf + h : nullptr,
                            vf ? vf + h : nullptr, ldkv, p, std::min(p1, p + 64), head_dim, scale,
                            m + h * rows, l + h * rows, acc + h * rows * head_dim, s);
}

template AttentionBlockFn attention_block_of<KvDtype::f16>;
template AttentionBlockFn attention_block_of<KvDtype::bf16>;
template AttentionBlockFn attention_block_of<KvDtype::fp8>;
template AttentionBlockFn attention_block_of<KvDtype::int8>;
template AllHeadsFn all_heads_of<KvDtype::f16>;
template AllHeadsFn all_heads_of<KvDtype::bf16>;
template AllHeadsFn all_heads_of<KvDtype::fp8>;
template AllHeadsFn all_heads_of<KvDtype::int8>;

}  // namespace ellm::scalar
