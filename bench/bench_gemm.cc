// Matrix products on real Qwen3 shapes, 2 threads, best instruction set (ELLM_ISA lowers it):
// GFLOP/s for every m, and GB/s of weights streamed for decode-sized m. Plus the register-only
// vdpbf16ps peak, to read the GEMM figures as a fraction of it. And a whole decode step's weight
// stream (decode_weight_stream), which is larger than any cache, against the read bandwidth.
//
//   bench_gemm --benchmark_filter='0.6B'     ELLM_ISA=avx2 bench_gemm ...
// Kinds: matmul/ (BF16), matmul_fp8/, matmul_int4/ (BF16 inputs), matmul_int4_int8/ (int8 inputs).
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/clock.h"
#include "base/cpu.h"
#include "base/threads.h"
#include "kernels/kernels.h"
#include "tools/machine_limits.h"

namespace ellm {
namespace {

constexpr int kThreads = 2;

ThreadTeam& team() {
  static ThreadTeam t(kThreads, /*pin=*/true, /*adaptive=*/false);
  return t;
}

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + t.tv_nsec * 1e-9;
}

// Packed weights are cached per shape: packing an 8B FFN matrix takes longer than running it.
const PackedWeights& weights(int64_t n, int64_t k) {
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<PackedWeights>> cache;
  auto& slot = cache[{n, k}];
  if (!slot) {
    std::vector<bf16> w(size_t(n * k));
    std::mt19937 rng(1);
    for (auto& v : w) v = f32_to_bf16(float(int(rng() % 2001) - 1000) / 1000.0f);
    slot = std::make_unique<PackedWeights>(pack_weights(w.data(), n, k, active_isa()));
  }
  return *slot;
}

// The same shapes as FP8 E4M3 weights (random finite codes, factors near 1/448).
const PackedWeights& fp8_weights(int64_t n, int64_t k) {
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<PackedWeights>> cache;
  auto& slot = cache[{n, k}];
  if (!slot) {
    std::vector<uint8_t> codes(size_t(n * k));
    std::mt19937 rng(1);
    for (auto& c : codes) c = uint8_t(rng() % 0x7f) | uint8_t(rng() % 2 ? 0x80 : 0);
    std::vector<float> scales(size_t(((n + 127) / 128) * ((k + 127) / 128)), 1.0f / 448);
    slot = std::make_unique<PackedWeights>(
        pack_fp8_weights(codes.data(), scales.data(), n, k, active_isa()));
  }
  return *slot;
}

// The same shapes as INT4 weights in groups of 128 (random codes and zero points); `int8`: their
// products quantise the inputs to int8 (--activations int8).
const PackedWeights& int4_weights(int64_t n, int64_t k, bool int8) {
  static std::map<std::tuple<int64_t, int64_t, bool>, std::unique_ptr<PackedWeights>> cache;
  auto& slot = cache[{n, k, int8}];
  if (!slot) {
    std::vector<uint8_t> codes(size_t(n * k)), zeros(size_t(n * k / 128));
    std::mt19937 rng(1);
    for (auto& c : codes) c = uint8_t(rng() % 16);
    for (auto& z : zeros) z = uint8_t(rng() % 16);
    std::vector<float> scales(zeros.size(), 1.0f / 16);
    slot = std::make_unique<PackedWeights>(
        pack_int4_weights(codes.data(), scales.data(), zeros.data(), n, k, 128, active_isa()));
    slot->int8_inputs = int8;
  }
  return *slot;
}

void BM_matmul(benchmark::State& state, int64_t n, int64_t k, const std::string& kind) {
  int64_t m = state.range(0);
  const PackedWeights& w = kind == "fp8"         ? fp8_weights(n, k)
                           : kind == "int4"      ? int4_weights(n, k, false)
                           : kind == "int4_int8" ? int4_weights(n, k, true)
                                                 : weights(n, k);
  std::vector<bf16> x(size_t(m * k), f32_to_bf16(0.01f));
  auto y = make_buffer<float>(size_t(m * n));
  double cpu_start = thread_cpu_seconds();
  for (auto _ : state) {
    team().run([&](int member, int members) {
      matmul(x.data(), m, k, w, y.get(), n, false, member, members);
    });
    benchmark::ClobberMemory();
  }
  // On a shared machine wall time includes waiting for a core; member 0's CPU time does not.
  double core_seconds = (thread_cpu_seconds() - cpu_start) / double(state.iterations());
  double flops = 2.0 * m * n * k;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["core_GFLOP/s"] = flops / kThreads / core_seconds * 1e-9;
  if (m <= 8) {
    state.counters["weights_GB/s"] =
        benchmark::Counter(double(w.bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["core_GB/s"] = double(w.bytes) / kThreads / core_seconds * 1e-9;
  }
  state.SetLabel(std::string(isa_name(w.isa)) + (kind == "bf16" ? "" : " " + kind));
}

struct Shape {
  const char* name;
  int64_t n, k;
};

const Shape kShapes[] = {
    {"0.6B/qkv", 2048 + 1024 + 1024, 1024}, {"0.6B/o_proj", 1024, 2048},
    {"0.6B/gate_up", 3072 * 2, 1024},       {"0.6B/down", 1024, 3072},
    {"8B/qkv", 4096 + 1024 + 1024, 4096},   {"8B/o_proj", 4096, 4096},
    {"8B/gate_up", 12288 * 2, 4096},        {"8B/down", 4096, 12288},
    // A slice of gate_up small enough for L2 (INT4: 256 KiB): the kernels' compute alone.
    {"L2/gate_up_slice", 512, 1024},
};

// 12 independent vdpbf16ps chains, no memory: 12 x 16 lanes x 2 MACs x 2 FLOP per iteration.
__attribute__((target("avx512f,avx512bf16"))) float dpbf16_loop(int64_t iterations) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i));
  __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = a;
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __asm__ volatile("" : "+v"(a), "+v"(b));
  }
  __m512 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm512_add_ps(sum, acc[i]);
  float lanes[16];
  _mm512_storeu_ps(lanes, sum);
  return lanes[0];
}

// The same with vpdpbusd (AVX-512-VNNI): 12 x 16 lanes x 4 int8 MACs x 2 "FLOP" per iteration.
__attribute__((target("avx512f,avx512vnni"))) int dpbusd_loop(int64_t iterations) {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  __m512i a = _mm512_set1_epi32(0x01020304), b = a;
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    __asm__ volatile("" : "+v"(a), "+v"(b));
  }
  __m512i sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  return _mm512_reduce_add_epi32(sum);
}

void BM_dpbusd_peak(benchmark::State& state) {
  if (best_isa() < Isa::avx512) return state.SkipWithError("no AVX-512");
  constexpr int64_t kIterations = 1 << 20;
  double cpu_start = thread_cpu_seconds();
  for (auto _ : state) benchmark::DoNotOptimize(dpbusd_loop(kIterations));
  state.counters["core_GOP/s"] = double(kIterations) * 12 * 16 * 8 /
                                 ((thread_cpu_seconds() - cpu_start) / double(state.iterations())) * 1e-9;
}

void BM_dpbf16_peak(benchmark::State& state) {
  if (best_isa() < Isa::avx512) return state.SkipWithError("no AVX-512 BF16");
  int threads = int(state.range(0));
  constexpr int64_t kIterations = 1 << 20;
  double cpu_start = thread_cpu_seconds();
  for (auto _ : state) {
    if (threads == 1) {
      benchmark::DoNotOptimize(dpbf16_loop(kIterations));
    } else {
      team().run([&](int, int) { benchmark::DoNotOptimize(dpbf16_loop(kIterations)); });
    }
  }
  double flops = double(kIterations) * 12 * 16 * 4;
  state.counters["GFLOP/s"] = benchmark::Counter(threads * flops * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["core_GFLOP/s"] =
      flops / ((thread_cpu_seconds() - cpu_start) / double(state.iterations())) * 1e-9;
}

// One decode step's weight stream of a Qwen3-0.6B-shaped model without the model: 28 layers of
// qkv, o_proj, gate_up and down, then the tied lm_head (1.19 GB in BF16), one matrix-vector
// product after another as decode runs them, against the read bandwidth measured just before and
// after; BF16, FP8 or INT4 (BF16 or int8 inputs). The
// layers' products are 4-12 MB each, so this shows what starting 112 short streams per step
// costs beside the one long lm_head stream (its own row), and what 4 slots (m = 4) cost.
struct StepWeights {
  std::vector<PackedWeights> layers;
  PackedWeights lm_head;
  size_t layer_bytes = 0;
};

// The step's matrices as `kind` (bf16, fp8, int4, int4_int8), lm_head included (as --quantize
// int4 makes it).
PackedWeights step_matrix(const std::vector<bf16>& source, int64_t n, int64_t k, const std::string& kind) {
  if (kind == "bf16") return pack_weights(source.data(), n, k, active_isa());
  std::mt19937 rng(uint32_t(n + k));
  if (kind == "fp8") {
    std::vector<uint8_t> codes(size_t(n * k));
    for (auto& c : codes) c = uint8_t(rng() % 0x7f) | uint8_t(rng() % 2 ? 0x80 : 0);
    std::vector<float> scales(size_t(((n + 127) / 128) * ((k + 127) / 128)), 1.0f / 448);
    return pack_fp8_weights(codes.data(), scales.data(), n, k, active_isa());
  }
  PackedWeights w = make_int4_weights(n, k, 128, active_isa());
  for (int64_t b = 0; b < (n + 31) / 32 * k * 16; ++b) w.codes[size_t(b)] = uint8_t(rng());
  for (int64_t i = 0; i < (n + 31) / 32 * 32 * (k / 128); ++i) {
    w.scales[size_t(i)] = 1.0f / 16;
    w.zeros[size_t(i)] = uint8_t(rng() % 16);
  }
  w.int8_inputs = kind == "int4_int8";
  return w;
}

const StepWeights& step_weights(const std::string& kind) {
  static std::map<std::string, StepWeights> cache;
  auto it = cache.find(kind);
  if (it != cache.end()) return it->second;
  StepWeights& s = cache[kind];
  const int64_t hidden = 1024, vocab = 151936;
  static std::vector<bf16> source = [&] {
    std::vector<bf16> v(size_t(vocab * hidden));
    std::mt19937 rng(1);
    for (auto& x : v) x = f32_to_bf16(float(int(rng() % 2001) - 1000) / 1000.0f);
    return v;
  }();
  for (int layer = 0; layer < 28; ++layer)
    for (const Shape& shape : kShapes)
      if (std::string(shape.name).rfind("0.6B/", 0) == 0) {
        s.layers.push_back(step_matrix(source, shape.n, shape.k, kind));
        s.layer_bytes += s.layers.back().bytes;
      }
  s.lm_head = step_matrix(source, vocab, hidden, kind);
  return s;
}

void BM_decode_weight_stream(benchmark::State& state, const std::string& kind) {
  const int64_t m = state.range(0);  // slots decoding together
  const bool lm_head_only = state.range(1) == 1;
  const StepWeights& w = step_weights(kind);
  static ReadBandwidthProbe probe(team(), read_probe_bytes());
  std::vector<bf16> x(size_t(m * 3072), f32_to_bf16(0.01f));  // 3072: the longest k (down)
  auto y = make_buffer<float>(size_t(m * 151936));
  alignas(64) std::atomic<int64_t> pool{0};
  auto product = [&](const PackedWeights& w) {
    pool.store(0, std::memory_order_relaxed);
    team().run([&](int member, int members) {
      matmul(x.data(), m, w.k, w, y.get(), w.n, false, member, members, &pool);
    });
  };
  double before = probe.measure(3), seconds = 0;
  for (auto _ : state) {
    double start = now_seconds();
    if (!lm_head_only)
      for (const PackedWeights& layer : w.layers) product(layer);
    product(w.lm_head);
    seconds += now_seconds() - start;
  }
  double after = probe.measure(3);
  double bytes = double(w.lm_head.bytes) + (lm_head_only ? 0.0 : double(w.layer_bytes));
  double rate = bytes * double(state.iterations()) / seconds;
  state.counters["weights_GB/s"] = rate * 1e-9;
  state.counters["read_GB/s"] = std::max(before, after) * 1e-9;
  state.counters["fraction_of_read"] = rate / std::max(before, after);
  state.SetLabel(kind + (lm_head_only ? ", lm_head alone" : ", whole step"));
}

int register_all() {
  for (const Shape& s : kShapes) {
    for (const std::string kind : {"bf16", "fp8", "int4", "int4_int8"}) {
      auto* b = benchmark::RegisterBenchmark(
          ((kind == "bf16" ? "matmul/" : "matmul_" + kind + "/") + s.name).c_str(), BM_matmul, s.n,
          s.k, kind);
      b->ArgName("m")->Arg(1)->Arg(4)->Arg(512)->Arg(2048)->UseRealTime()->Unit(benchmark::kMillisecond);
    }
  }
  for (const std::string kind : {"bf16", "fp8", "int4", "int4_int8"})
    benchmark::RegisterBenchmark(("decode_weight_stream/0.6B/" + kind).c_str(), BM_decode_weight_stream, kind)
        ->ArgNames({"m", "lm_head_only"})->Args({1, 0})->Args({1, 1})->Args({4, 0})
        ->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("dpbf16_peak/threads", BM_dpbf16_peak)->Arg(1)->Arg(kThreads)->UseRealTime();
  benchmark::RegisterBenchmark("dpbusd_peak/one_core", BM_dpbusd_peak)->UseRealTime();
  return 0;
}
const int registered = register_all();

}  // namespace
}  // namespace ellm

BENCHMARK_MAIN();
