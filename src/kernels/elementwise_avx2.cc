// AVX2 element-wise kernels: whole vectors of 8 here, tails by the scalar twins.
#include <cmath>

#include "kernels/isa_kernels.h"
#include "kernels/vector_math_avx2.h"

namespace ellm::avx2 {

void convert_f32_to_bf16(const float* x, bf16* out, int64_t count) {
  // Integer round-to-nearest-even, bit-identical to f32_to_bf16.
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(x + i));
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
    rounded = _mm256_srli_epi32(rounded, 16);
    __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), inf);
    __m256i result = _mm256_blendv_epi8(rounded, quiet_nan, nan);
    // Values fit 16 bits; packus interleaves 128-bit lanes, permute puts them back in order.
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(result, result), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(packed));
  }
  scalar::convert_f32_to_bf16(x + i, out + i, count - i);
}

void convert_bf16_to_f32(const bf16* x, float* out, int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8)
    _mm256_storeu_ps(out + i, bf16x8_to_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  scalar::convert_bf16_to_f32(x + i, out + i, count - i);
}

void convert_f32_to_f16(const float* x, f16* out, int64_t count) {
  // Saturate first, as f32_to_f16 does; the limit goes first so a NaN passes through min/max.
  const __m256 limit = _mm256_set1_ps(65504.0f), minus_limit = _mm256_set1_ps(-65504.0f);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 v = _mm256_max_ps(minus_limit, _mm256_min_ps(limit, _mm256_loadu_ps(x + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  scalar::convert_f32_to_f16(x + i, out + i, count - i);
}

void rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight,
             float eps, float* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* o = out + r * ldo;
    __m256 sum = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= dim; i += 8) sum = _mm256_fmadd_ps(_mm256_loadu_ps(xr + i), _mm256_loadu_ps(xr + i), sum);
    float sum_sq = hsum(sum);
    for (; i < dim; ++i) sum_sq += xr[i] * xr[i];
    float inv_rms = 1.0f / std::sqrt(sum_sq / float(dim) + eps);
    __m256 vinv = _mm256_set1_ps(inv_rms);
    for (i = 0; i + 8 <= dim; i += 8)
      _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), vinv),
                                            _mm256_loadu_ps(weight + i)));
    for (; i < dim; ++i) o[i] = xr[i] * inv_rms * weight[i];
  }
}

void norm_rope(const float* x, int64_t n_heads, int64_t head_dim, const float* weight, float eps,
               const float* cos, const float* sin, float* out, int64_t ldo) {
  int64_t half = head_dim / 2;
  if (head_dim % 2 || half % 8)
    return scalar::norm_rope(x, n_heads, head_dim, weight, eps, cos, sin, out, ldo);
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* lo = x + h * head_dim;
    const float* hi = lo + half;
    __m256 sum = _mm256_setzero_ps();
    for (int64_t i = 0; i < head_dim; i += 8) {
      __m256 v = _mm256_loadu_ps(lo + i);
      sum = _mm256_fmadd_ps(v, v, sum);
    }
    __m256 inv_rms = _mm256_set1_ps(1.0f / std::sqrt(hsum(sum) / float(head_dim) + eps));
    float* o = out + h * ldo;
    for (int64_t i = 0; i < half; i += 8) {
      __m256 a = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(lo + i), inv_rms), _mm256_loadu_ps(weight + i));
      __m256 b = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(hi + i), inv_rms),
                               _mm256_loadu_ps(weight + half + i));
      __m256 c = _mm256_loadu_ps(cos + i), s = _mm256_loadu_ps(sin + i);
      _mm256_storeu_ps(o + i, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
      _mm256_storeu_ps(o + half + i, _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)));
    }
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t count) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 g = _mm256_loadu_ps(gate + i);
    __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
    __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  scalar::silu_mul(gate + i, up + i, out + i, count - i);
}

}  // namespace ellm::avx2
