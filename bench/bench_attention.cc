// Attention alone on the Qwen3-0.6B head shape (16 query heads, 8 KV heads, head_dim 128), over
// a KV cache laid out as the model's ([position][kv_head][head_dim] FP16), 2 threads:
//  - decode: one query per sequence against `context` cached positions; GB/s of K+V streamed,
//    and its fraction of a sequential read measured right after (of_read). At 256 positions
//    (1 MiB of K and V) the cache stays in L2, so that row is the kernel's compute rate;
//  - prefill: n queries of one sequence, causal; GFLOP/s.
// Each in FP32 (products:0) and on BF16 products (products:1; AttentionShape::bf16_products,
// FP32 on a tier without them).
//
//   bench_attention --benchmark_filter=decode
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "base/memory.h"
#include "base/threads.h"
#include "kernels/kernels.h"
#include "tools/machine_limits.h"

namespace ellm {
namespace {

constexpr int64_t kHeads = 16, kKvHeads = 8, kHeadDim = 128;

ThreadTeam& team() {
  static ThreadTeam t(2, /*pin=*/true, /*adaptive=*/false);
  return t;
}

struct Setup {
  AttentionShape shape{kHeads, kKvHeads, kHeadDim, kHeads * kHeadDim, kHeads * kHeadDim,
                       kKvHeads * kHeadDim, 1.0f / std::sqrt(float(kHeadDim))};
  Buffer<float> q, out, scratch;
  Buffer<f16> k, v;
  std::vector<AttentionSeq> seqs;

  // n_seqs sequences of n_q queries each, the queries at the end of `context` positions.
  Setup(int64_t n_seqs, int64_t n_q, int64_t context, bool bf16_products) {
    shape.bf16_products = bf16_products;
    int64_t tokens = n_seqs * n_q, cache = context * shape.kv_row_stride;
    q = make_buffer<float>(size_t(tokens * shape.ldq));
    out = make_buffer<float>(size_t(tokens * shape.ldo));
    k = make_buffer<f16>(size_t(n_seqs * cache));
    v = make_buffer<f16>(size_t(n_seqs * cache));
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (int64_t i = 0; i < tokens * shape.ldq; ++i) q[i] = dist(rng);
    for (int64_t i = 0; i < n_seqs * cache; ++i) k[i] = f32_to_f16(dist(rng)), v[i] = f32_to_f16(dist(rng));
    scratch = make_buffer<float>(attention_scratch_floats(shape, tokens, n_seqs, team().size()));
    for (int64_t s = 0; s < n_seqs; ++s)
      seqs.push_back({q.get() + s * n_q * shape.ldq, out.get() + s * n_q * shape.ldo, n_q,
                      context - n_q, k.get() + s * cache, v.get() + s * cache});
  }

  void run() {
    team().run([&](int member, int n) {
      attention(seqs.data(), int64_t(seqs.size()), shape, scratch.get(), member, n);
    });
  }
};

void BM_decode(benchmark::State& state) {
  int64_t batch = state.range(0), context = state.range(1);
  Setup setup(batch, 1, context, state.range(2) != 0);
  double seconds = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    setup.run();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  double bytes = 2.0 * double(batch * context * setup.shape.kv_row_stride) * sizeof(f16);
  double achieved = bytes * double(state.iterations()) / seconds;
  // This machine's bandwidth drifts (a VM's neighbours), so the limit is read right after.
  double read = measure_read_bandwidth(team(), read_probe_bytes(), 3);
  state.counters["GB/s"] = achieved / 1e9;
  state.counters["read_GB/s"] = read / 1e9;
  state.counters["of_read"] = achieved / read;
}
BENCHMARK(BM_decode)
    ->ArgsProduct({{1, 4}, {256, 2048, 8192, 32768}, {0, 1}})
    ->ArgNames({"batch", "context", "products"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_prefill(benchmark::State& state) {
  int64_t n = state.range(0);
  Setup setup(1, n, n, state.range(1) != 0);
  for (auto _ : state) setup.run();
  double flops = 4.0 * kHeads * kHeadDim * double(n) * double(n + 1) / 2;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * double(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_prefill)
    ->ArgsProduct({{512, 2048, 8192}, {0, 1}})
    ->ArgNames({"tokens", "products"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ellm

BENCHMARK_MAIN();
