// AVX-512 element-wise kernels; tails use masked loads and stores.
#include <cmath>

#include "kernels/isa_kernels.h"
#include "kernels/vector_math_avx512.h"

namespace ellm::avx512 {

void convert_f32_to_bf16(const float* x, bf16* out, int64_t count) {
  // Integer round-to-nearest-even, bit-identical to f32_to_bf16 (vcvtneps2bf16 flushes denormals).
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  for (int64_t i = 0; i < count; i += 16) {
    __mmask16 mask = tail_mask(count - i);
    __m512i bits = _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, x + i));
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
    rounded = _mm512_srli_epi32(rounded, 16);
    __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, abs_mask), inf);
    __m512i result = _mm512_mask_blend_epi32(nan, rounded, quiet_nan);
    _mm256_mask_storeu_epi16(out + i, mask, _mm512_cvtepi32_epi16(result));
  }
}

void convert_bf16_to_f32(const bf16* x, float* out, int64_t count) {
  for (int64_t i = 0; i < count; i += 16) {
    __mmask16 mask = tail_mask(count - i);
    __m256i h = _mm256_maskz_loadu_epi16(mask, x + i);
    __m512i bits = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    _mm512_mask_storeu_ps(out + i, mask, _mm512_castsi512_ps(bits));
  }
}

void convert_f32_to_f16(const float* x, f16* out, int64_t count) {
  // Saturate first, as f32_to_f16 does; the limit goes first so a NaN passes through min/max.
  const __m512 limit = _mm512_set1_ps(65504.0f), minus_limit = _mm512_set1_ps(-65504.0f);
  for (int64_t i = 0; i < count; i += 16) {
    __mmask16 mask = tail_mask(count - i);
    __m512 v = _mm512_max_ps(minus_limit, _mm512_min_ps(limit, _mm512_maskz_loadu_ps(mask, x + i)));
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(out + i, mask, h);
  }
}

void rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight,
             float eps, float* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* o = out + r * ldo;
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= dim; i += 32) {
      __m512 a = _mm512_loadu_ps(xr + i), b = _mm512_loadu_ps(xr + i + 16);
      sum0 = _mm512_fmadd_ps(a, a, sum0);
      sum1 = _mm512_fmadd_ps(b, b, sum1);
    }
    for (; i < dim; i += 16) {
      __m512 a = _mm512_maskz_loadu_ps(tail_mask(dim - i), xr + i);
      sum0 = _mm512_fmadd_ps(a, a, sum0);
    }
    float sum_sq = _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
    __m512 inv_rms = _mm512_set1_ps(1.0f / std::sqrt(sum_sq / float(dim) + eps));
    for (i = 0; i < dim; i += 16) {
      __mmask16 mask = tail_mask(dim - i);
      __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, xr + i), inv_rms);
      _mm512_mask_storeu_ps(o + i, mask, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(mask, weight + i)));
    }
  }
}

void norm_rope(const float* x, int64_t n_heads, int64_t head_dim, const float* weight, float eps,
               const float* cos, const float* sin, float* out, int64_t ldo) {
  if (head_dim % 2) return scalar::norm_rope(x, n_heads, head_dim, weight, eps, cos, sin, out, ldo);
  int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* lo = x + h * head_dim;
    const float* hi = lo + half;
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < head_dim; i += 16) {
      __m512 v = _mm512_maskz_loadu_ps(tail_mask(head_dim - i), lo + i);
      sum = _mm512_fmadd_ps(v, v, sum);
    }
    __m512 inv_rms = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(sum) / float(head_dim) + eps));
    float* o = out + h * ldo;
    for (int64_t i = 0; i < half; i += 16) {
      __mmask16 mask = tail_mask(half - i);
      __m512 a = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, lo + i), inv_rms),
                               _mm512_maskz_loadu_ps(mask, weight + i));
      __m512 b = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, hi + i), inv_rms),
                               _mm512_maskz_loadu_ps(mask, weight + half + i));
      __m512 c = _mm512_maskz_loadu_ps(mask, cos + i), s = _mm512_maskz_loadu_ps(mask, sin + i);
      _mm512_mask_storeu_ps(o + i, mask, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)));
      _mm512_mask_storeu_ps(o + half + i, mask, _mm512_fmadd_ps(b, c, _mm512_mul_ps(a, s)));
    }
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t count) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < count; i += 16) {
    __mmask16 mask = tail_mask(count - i);
    __m512 g = _mm512_maskz_loadu_ps(mask, gate + i), u = _mm512_maskz_loadu_ps(mask, up + i);
    __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, mask, _mm512_mul_ps(silu, u));
  }
}

}  // namespace ellm::avx512
