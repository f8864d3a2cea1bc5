// AVX-512 flash-attention step (contract in isa_kernels.h). Per row: scores by vector dot
// products, online-softmax update with a vector exp, then P.V accumulated in registers, 128
// output dimensions at a time.
#include <cmath>

#include "kernels/isa_kernels.h"
#include "kernels/vector_math_avx512.h"

namespace ellm::avx512 {
namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  __m512 sum = _mm512_setzero_ps();
  for (int64_t d = 0; d < n; d += 16) {
    __mmask16 mask = tail_mask(n - d);
    sum = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, a + d), _mm512_maskz_loadu_ps(mask, b + d), sum);
  }
  return _mm512_reduce_add_ps(sum);
}

// acc[0:n] = acc * correction + sum_j p[j] * v[j * n : (j + 1) * n]
void scale_and_accumulate(float* acc, float correction, const float* p, const float* v,
                          int64_t count, int64_t n) {
  for (int64_t d0 = 0; d0 < n; d0 += 128) {
    __mmask16 mask[8];
    __m512 a[8];
    __m512 c = _mm512_set1_ps(correction);
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) {
      mask[t] = d0 + 16 * t < n ? tail_mask(n - d0 - 16 * t) : 0;
      a[t] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask[t], acc + d0 + 16 * t), c);
    }
    for (int64_t j = 0; j < count; ++j) {
      __m512 pj = _mm512_set1_ps(p[j]);
      const float* vj = v + j * n + d0;
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t)
        a[t] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(mask[t], vj + 16 * t), a[t]);
    }
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) _mm512_mask_storeu_ps(acc + d0 + 16 * t, mask[t], a[t]);
  }
}

}  // namespace

void attention_block(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
                     const float* k, const float* v, int64_t p0, int64_t p1, int64_t head_dim,
                     float scale, float* m, float* l, float* acc, float* s) {
  int64_t width = p1 - p0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t visible = std::min(p1, first_end + r / group) - p0;
    if (visible <= 0) continue;
    const float* qr = q + (r / group) * ldq + (r % group) * head_dim;
    float* sr = s + r * width;
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < visible; ++j) sr[j] = dot(qr, k + (p0 + j) * head_dim, head_dim) * scale;
    for (int64_t j = 0; j < visible; j += 16)
      vmax = _mm512_mask_max_ps(vmax, tail_mask(visible - j), vmax,
                                _mm512_maskz_loadu_ps(tail_mask(visible - j), sr + j));
    float new_max = std::max(m[r], _mm512_reduce_max_ps(vmax));
    float correction = std::exp(m[r] - new_max);  // 0 on the first block (m = -inf)
    __m512 vsum = _mm512_setzero_ps(), vnew_max = _mm512_set1_ps(new_max);
    for (int64_t j = 0; j < visible; j += 16) {
      __mmask16 mask = tail_mask(visible - j);
      __m512 p = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, sr + j), vnew_max));
      p = _mm512_maskz_mov_ps(mask, p);
      vsum = _mm512_add_ps(vsum, p);
      _mm512_mask_storeu_ps(sr + j, mask, p);
    }
    l[r] = l[r] * correction + _mm512_reduce_add_ps(vsum);
    m[r] = new_max;
    scale_and_accumulate(acc + r * head_dim, correction, sr, v + p0 * head_dim, visible, head_dim);
  }
}

}  // namespace ellm::avx512
