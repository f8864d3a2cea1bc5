// The AVX-512 tier's peak loops and read loops, for measure_peak_flops and the read bandwidth
// probe.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/vec_avx512.h"
#include "tools/simd_peak_loop.h"

namespace ellm {

// The BF16 dot-product peak (peak_loop), 2 BF16 pairs per lane per vdpbf16ps.
float peak_loop_avx512_bf16(int64_t iterations) {
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3c00);
  return _mm512_reduce_add_ps(peak_loop<Avx512Vec>(
      iterations, a, b, [](__m512 x, __m512bh p, __m512bh q) { return _mm512_dpbf16_ps(x, p, q); }));
}

// The same with FP32 FMAs: the peak of work that stays in FP32.
float peak_loop_avx512_fma(int64_t iterations) {
  return _mm512_reduce_add_ps(peak_loop_fma<Avx512Vec>(iterations));
}

// Sums 64-bit words of [data, data+bytes) with four streams of 512-bit loads, 2 KiB at a time.
// With `prefetch`, it fetches the next 2 KiB while summing the current one, as the AMX decode
// product reads its weights: on Xeons that streams faster than without, where on AMD EPYC
// software prefetch slows such streams.
uint64_t read_stream_avx512(const uint8_t* data, size_t bytes, bool prefetch) {
  constexpr size_t kAhead = 2048;
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 256 <= bytes; i += kAhead) {
    if (prefetch && i + 2 * kAhead <= bytes)
      for (size_t line = 0; line < kAhead; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(data + i + kAhead + line), _MM_HINT_T0);
    const size_t end = std::min(bytes, i + kAhead);
    for (size_t j = i; j + 256 <= end; j += 256) {
      s0 = _mm512_add_epi64(s0, _mm512_load_si512(data + j));
      s1 = _mm512_add_epi64(s1, _mm512_load_si512(data + j + 64));
      s2 = _mm512_add_epi64(s2, _mm512_load_si512(data + j + 128));
      s3 = _mm512_add_epi64(s3, _mm512_load_si512(data + j + 192));
    }
  }
  __m512i s = _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3));
  return uint64_t(_mm512_reduce_add_epi64(s));
}

// Reads [data, data+bytes) as decode's matrix-vector products do: one vdpbf16ps per loaded line.
// On AMD EPYC this reads faster than the plain sums above, and decode itself streams faster than
// those sums, so the probe takes the best of the loops.
float read_stream_dot_avx512_bf16(const uint8_t* data, size_t bytes) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3f80);
  for (size_t i = 0; i + 128 <= bytes; i += 128) {
    a0 = _mm512_dpbf16_ps(a0, ones, (__m512bh)_mm512_load_si512(data + i));
    a1 = _mm512_dpbf16_ps(a1, ones, (__m512bh)_mm512_load_si512(data + i + 64));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

}  // namespace ellm
