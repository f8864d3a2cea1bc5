// The Gated DeltaNet delta rule alone, on Qwen3.5's head shape (dk = dv = 128), one thread, best
// instruction set (ELLM_ISA lowers it):
//  - chunk: gated_delta_chunk over 64 tokens of one head (prefill);
//  - step: gated_delta_step, one token of one head (decode): its state (64 KiB) read and written.
// FLOP/s count the recurrence's work, 6 dk dv per token (what either form computes), and
// fraction_of_f32_peak divides by one core's FP32 FMA peak measured in the same run.
//
//   bench_gdn                 ELLM_ISA=avx2 bench_gdn
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/threads.h"
#include "kernels/kernels.h"
#include "tools/machine_limits.h"

namespace ellm {
namespace {

constexpr int64_t kDim = 128;

double core_f32_peak() {
  static double peak = [] {
    ThreadTeam one(1, /*pin=*/true, /*adaptive=*/false);
    return measure_peak_flops_f32(one);
  }();
  return peak;
}

struct Head {
  std::vector<float> S, q, k, v, g, beta, out, scratch;
  explicit Head(int64_t n)
      : S(kDim * kDim), q(n * kDim), k(n * kDim), v(n * kDim), g(n), beta(n), out(n * kDim),
        scratch(gated_delta_chunk_scratch_floats(kDim, kDim)) {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (auto* x : {&S, &q, &k, &v}) for (float& f : *x) f = dist(rng) * 0.1f;
    for (int64_t t = 0; t < n; ++t) {
      l2norm(q.data() + t * kDim, 1, kDim, kDim, 1.0f / std::sqrt(float(kDim)), 1e-6f, q.data() + t * kDim, kDim);
      l2norm(k.data() + t * kDim, 1, kDim, kDim, 1.0f, 1e-6f, k.data() + t * kDim, kDim);
      g[t] = -0.05f;
      beta[t] = 0.5f;
    }
  }
};

void report(benchmark::State& state, int64_t tokens) {
  const double flops = 6.0 * kDim * kDim * double(tokens) * double(state.iterations());
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsRate);
  state.counters["fraction_of_f32_peak"] =
      benchmark::Counter(flops / core_f32_peak(), benchmark::Counter::kIsRate);
}

void chunk(benchmark::State& state) {
  const int64_t n = state.range(0);
  Head h(n);
  core_f32_peak();
  for (auto _ : state)
    gated_delta_chunk(h.S.data(), kDim, kDim, h.q.data(), h.k.data(), kDim, h.v.data(), kDim, h.g.data(),
                      h.beta.data(), 1, n, h.out.data(), kDim, h.scratch.data());
  report(state, n);
}
BENCHMARK(chunk)->Arg(64)->Arg(17)->UseRealTime();

void step(benchmark::State& state) {
  Head h(1);
  core_f32_peak();
  for (auto _ : state)
    gated_delta_step(h.S.data(), kDim, kDim, h.q.data(), h.k.data(), h.v.data(), 0.95f, 0.5f, h.out.data());
  report(state, 1);
}
BENCHMARK(step)->UseRealTime();

}  // namespace
}  // namespace ellm

BENCHMARK_MAIN();
