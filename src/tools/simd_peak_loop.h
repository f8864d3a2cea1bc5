#pragma once
// The register-only peak loops of measure_peak_flops and measure_peak_flops_f32
// (machine_limits.h), written once over vector traits V (kernels/vec_*.h) for the tier folders
// tools/avx2/ and tools/avx512/, which alone include this header.
#include <cstdint>

namespace ellm {

// x = step(x, a, b) on 12 independent accumulator chains, which hide the step's latency, so the
// loop runs at the pipes' throughput; the chains' sum comes back, so the compiler cannot drop
// the work.
template <class V, class In, class Step>
typename V::F peak_loop(int64_t iterations, In a, In b, Step step) {
  using F = typename V::F;
  F acc[12];
#pragma GCC unroll 12
  for (auto& x : acc) {  // opaque, so the compiler cannot merge identical chains
    x = V::zero();
    __asm__ volatile("" : "+v"(x));
  }
  for (int64_t i = 0; i < iterations; ++i) {
    // Fully unrolled, or GCC keeps acc[] in memory and the loop measures store forwarding.
#pragma GCC unroll 12
    for (auto& x : acc) x = step(x, a, b);
    __asm__ volatile("" : "+v"(a));  // keep the inputs opaque
  }
  F sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = V::add(sum, acc[i]);
  return sum;
}

// The same with FP32 FMAs: the peak of work that stays in FP32, 2 FLOP per lane per FMA.
template <class V>
typename V::F peak_loop_fma(int64_t iterations) {
  using F = typename V::F;
  return peak_loop<V>(iterations, V::set1(1.0f), V::set1(0.5f),
                      [](F x, F a, F b) { return V::fmadd(a, b, x); });
}

}  // namespace ellm
