// Attention alone on the Qwen3-0.6B head shape (16 query heads, 8 KV heads, head_dim 128), over
// a KV cache laid out as the model's ([position][kv_head][head_dim] FP16), 2 threads:
//  - decode: one query per sequence against `context` cached positions; GB/s of K+V streamed,
//    and its fraction of a sequential read measured right after (of_read). At 256 positions
//    (1 MiB of K and V) the cache stays in L2, so that row is the kernel's compute rate;
//  - prefill: n queries of one sequence, causal; GFLOP/s.
// Each in FP32 (products:0) and on BF16 products (products:1; AttentionShape::bf16_products,
// FP32 on a tier without them). Decode also over int8 (kv:1) and FP8 (kv:2) caches: one-byte
// codes and a factor per position and head.
//
//   bench_attention --benchmark_filter=decode
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
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

// A model's attention shape: Qwen3-0.6B's above, or Qwen3.5-0.8B's full-attention layers (8 query
// heads over 2 KV heads of 256).
struct HeadShape {
  int64_t heads, kv_heads, head_dim;
};
constexpr HeadShape kQwen3{kHeads, kKvHeads, kHeadDim}, kQwen35{8, 2, 256};

ThreadTeam& team() {
  static ThreadTeam t(2, /*pin=*/true, /*adaptive=*/false);
  return t;
}

struct Setup {
  AttentionShape shape;
  Buffer<float> q, out, scratch;
  Buffer<uint8_t> k, v;
  std::vector<AttentionSeq> seqs;
  size_t cache_bytes = 0;  // K and V of every sequence

  // n_seqs sequences of n_q queries each, the queries at the end of `context` positions.
  Setup(int64_t n_seqs, int64_t n_q, int64_t context, bool bf16_products,
        KvDtype dtype = KvDtype::f16, HeadShape heads = kQwen3)
      : shape{heads.heads, heads.kv_heads, heads.head_dim, heads.heads * heads.head_dim,
              heads.heads * heads.head_dim, heads.kv_heads * heads.head_dim,
              1.0f / std::sqrt(float(heads.head_dim))} {
    const int64_t kv_elements = heads.kv_heads * heads.head_dim;
    shape.bf16_products = bf16_products;
    shape.kv_dtype = dtype;
    shape.kv_row_stride = kv_row_elements(dtype, heads.kv_heads, heads.head_dim);
    shape.max_positions = context;
    int64_t tokens = n_seqs * n_q;
    size_t row_bytes = kv_row_bytes(dtype, heads.kv_heads, heads.head_dim), cache = size_t(context) * row_bytes;
    cache_bytes = 2 * size_t(n_seqs) * cache;
    q = make_buffer<float>(size_t(tokens * shape.ldq));
    out = make_buffer<float>(size_t(tokens * shape.ldo));
    k = make_buffer<uint8_t>(size_t(n_seqs) * cache);
    v = make_buffer<uint8_t>(size_t(n_seqs) * cache);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (int64_t i = 0; i < tokens * shape.ldq; ++i) q[i] = dist(rng);
    std::uniform_int_distribution<int> code(0, 0x7e);  // E4M3 without NaN; int8 in [0, 126]
    for (uint8_t* cache_part : {k.get(), v.get()})
      for (size_t row = 0; row < size_t(n_seqs * context); ++row) {
        uint8_t* r = cache_part + row * row_bytes;
        if (dtype == KvDtype::f16) {
          for (int64_t i = 0; i < kv_elements; ++i) reinterpret_cast<f16*>(r)[i] = f32_to_f16(dist(rng));
        } else {
          for (int64_t i = 0; i < kv_elements; ++i) r[i] = uint8_t(code(rng) | (i & 1) << 7);
          for (int64_t h = 0; h < heads.kv_heads; ++h) {
            float factor = 1.0f / 448;
            std::memcpy(r + kv_elements + h * sizeof(float), &factor, sizeof factor);
          }
        }
      }
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

// The KV cache dtype argument: 0 fp16, 1 int8, 2 fp8 (E4M3).
KvDtype bench_dtype(int64_t arg) {
  return arg == 0 ? KvDtype::f16 : arg == 1 ? KvDtype::int8 : KvDtype::fp8;
}

void BM_decode(benchmark::State& state) {
  int64_t batch = state.range(0), context = state.range(1);
  Setup setup(batch, 1, context, state.range(2) != 0, bench_dtype(state.range(3)),
              state.range(4) ? kQwen35 : kQwen3);
  double seconds = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    setup.run();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  double achieved = double(setup.cache_bytes) * double(state.iterations()) / seconds;
  // This machine's bandwidth drifts (a VM's neighbours), so the limit is read right after.
  double read = measure_read_bandwidth(team(), read_probe_bytes(), 3);
  state.counters["GB/s"] = achieved / 1e9;
  state.counters["read_GB/s"] = read / 1e9;
  state.counters["of_read"] = achieved / read;
}
BENCHMARK(BM_decode)
    ->ArgsProduct({{1, 4}, {256, 2048, 8192, 32768}, {0, 1}, {0}, {0}})
    ->ArgsProduct({{1}, {256, 2048, 8192, 32768}, {0}, {1, 2}, {0}})
    ->ArgsProduct({{1}, {2048, 32768, 262144}, {0}, {0, 2}, {1}})
    ->ArgNames({"batch", "context", "products", "kv", "qwen35"})
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
