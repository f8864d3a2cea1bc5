// AVX2 flash-attention step (contract in isa_kernels.h); head_dim not a multiple of 8 goes to
// the scalar twin.
#include <cmath>

#include "kernels/isa_kernels.h"
#include "kernels/vector_math_avx2.h"

namespace ellm::avx2 {

void attention_block(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
                     const float* k, const float* v, int64_t p0, int64_t p1, int64_t head_dim,
                     float scale, float* m, float* l, float* acc, float* s) {
  if (head_dim % 8)
    return scalar::attention_block(q, ldq, group, rows, first_end, k, v, p0, p1, head_dim, scale,
                                   m, l, acc, s);
  int64_t width = p1 - p0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t visible = std::min(p1, first_end + r / group) - p0;
    if (visible <= 0) continue;
    const float* qr = q + (r / group) * ldq + (r % group) * head_dim;
    float* sr = s + r * width;
    float block_max = -INFINITY;
    for (int64_t j = 0; j < visible; ++j) {
      const float* kj = k + (p0 + j) * head_dim;
      __m256 sum = _mm256_setzero_ps();
      for (int64_t d = 0; d < head_dim; d += 8)
        sum = _mm256_fmadd_ps(_mm256_loadu_ps(qr + d), _mm256_loadu_ps(kj + d), sum);
      sr[j] = hsum(sum) * scale;
      block_max = std::max(block_max, sr[j]);
    }
    float new_max = std::max(m[r], block_max);
    float correction = std::exp(m[r] - new_max);  // 0 on the first block (m = -inf)
    float sum = 0;
    int64_t j = 0;
    __m256 vsum = _mm256_setzero_ps(), vmax = _mm256_set1_ps(new_max);
    for (; j + 8 <= visible; j += 8) {
      __m256 p = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(sr + j), vmax));
      vsum = _mm256_add_ps(vsum, p);
      _mm256_storeu_ps(sr + j, p);
    }
    for (; j < visible; ++j) sum += sr[j] = std::exp(sr[j] - new_max);
    l[r] = l[r] * correction + sum + hsum(vsum);
    m[r] = new_max;

    float* ar = acc + r * head_dim;
    const float* vb = v + p0 * head_dim;
    for (int64_t d = 0; d < head_dim; d += 32) {  // four vectors of the output in registers
      int lanes = int(std::min<int64_t>(4, (head_dim - d) / 8));
      __m256 a[4], c = _mm256_set1_ps(correction);
      for (int t = 0; t < lanes; ++t) a[t] = _mm256_mul_ps(_mm256_loadu_ps(ar + d + 8 * t), c);
      for (int64_t jj = 0; jj < visible; ++jj) {
        __m256 pj = _mm256_set1_ps(sr[jj]);
        for (int t = 0; t < lanes; ++t)
          a[t] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vb + jj * head_dim + d + 8 * t), a[t]);
      }
      for (int t = 0; t < lanes; ++t) _mm256_storeu_ps(ar + d + 8 * t, a[t]);
    }
  }
}

}  // namespace ellm::avx2
