// The AVX2 tier's peak loop and read loops, for measure_peak_flops and the read bandwidth probe.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/vec_avx2.h"
#include "tools/simd_peak_loop.h"

namespace ellm {

// FP32 FMA peak (no BF16 dot product on AVX2).
float peak_loop_avx2_fma(int64_t iterations) {
  float out[8];
  _mm256_storeu_ps(out, peak_loop_fma<Avx2Vec>(iterations));
  return out[0];
}

uint64_t read_stream_avx2(const uint8_t* data, size_t bytes) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    s0 = _mm256_add_epi64(s0, _mm256_load_si256((const __m256i*)(data + i)));
    s1 = _mm256_add_epi64(s1, _mm256_load_si256((const __m256i*)(data + i + 32)));
    s2 = _mm256_add_epi64(s2, _mm256_load_si256((const __m256i*)(data + i + 64)));
    s3 = _mm256_add_epi64(s3, _mm256_load_si256((const __m256i*)(data + i + 96)));
  }
  __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
  uint64_t out[4];
  _mm256_storeu_si256((__m256i*)out, s);
  return out[0] + out[1] + out[2] + out[3];
}

// Reads [data, data+bytes) with one FMA per loaded vector, as the matrix products do: on some
// machines that streams faster than the plain sums above (see the AVX-512 twin).
float read_stream_fma_avx2(const uint8_t* data, size_t bytes) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const __m256 ones = _mm256_set1_ps(1.0f);
  for (size_t i = 0; i + 128 <= bytes; i += 128) {
    a0 = _mm256_fmadd_ps(_mm256_load_ps((const float*)(data + i)), ones, a0);
    a1 = _mm256_fmadd_ps(_mm256_load_ps((const float*)(data + i + 32)), ones, a1);
    a2 = _mm256_fmadd_ps(_mm256_load_ps((const float*)(data + i + 64)), ones, a2);
    a3 = _mm256_fmadd_ps(_mm256_load_ps((const float*)(data + i + 96)), ones, a3);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

}  // namespace ellm
