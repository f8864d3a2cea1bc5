// The matrix-product kernels' compute rate on one core, weights in L2 (512 x 1024, a slice of
// Qwen3-0.6B's gate_up): the best of 400 runs of one thread, so a neighbour taking the core now
// and then does not lower it. Decode is memory-bound only if a core widens and multiplies weights
// faster than its share of the read bandwidth brings them: compare the GB/s here with `ellm bench`'s
// read bandwidth divided by the threads. BF16, FP8, INT4 with BF16 and with int8 inputs, for 1, 2,
// 4 and 64 rows, and the FP32 small products (dot_rows) over FP32 and FP8 weights for 1 and 4
// rows, on the active tier (ELLM_ISA lowers it; ELLM_NO_AVX_VNNI=1 runs AVX2's int8 sums without
// AVX-VNNI).
//
//   taskset -c 1 build/bench/bench_kernel_core
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "kernels/kernels.h"

using namespace ellm;

int main() {
  const int64_t n = 512, k = 1024;
  std::mt19937 rng(1);
  std::vector<bf16> bf16_weights(size_t(n * k));
  for (auto& v : bf16_weights) v = f32_to_bf16(float(int(rng() % 2001) - 1000) / 1000.0f);
  std::vector<uint8_t> fp8_codes(size_t(n * k)), int4_codes(size_t(n * k)), zeros(size_t(n * k / 128));
  for (auto& c : fp8_codes) c = uint8_t(rng() % 0x7f) | uint8_t(rng() % 2 ? 0x80 : 0);
  for (auto& c : int4_codes) c = uint8_t(rng() % 16);
  for (auto& z : zeros) z = uint8_t(rng() % 16);
  std::vector<float> fp8_scales(size_t(((n + 127) / 128) * ((k + 127) / 128)), 1.0f / 448);
  std::vector<float> int4_scales(zeros.size(), 1.0f / 16);
  std::printf("%s, one thread, %lld x %lld weights in L2, best of 400 runs\n", isa_name(active_isa()),
              (long long)n, (long long)k);
  std::printf("%-16s %5s %10s %10s %12s\n", "weights", "rows", "us", "GMAC/s", "weights GB/s");
  for (const std::string kind : {"bf16", "fp8", "int4/bf16", "int4/int8"}) {
    PackedWeights w = kind == "bf16" ? pack_weights(bf16_weights.data(), n, k, active_isa())
                      : kind == "fp8"
                          ? pack_fp8_weights(fp8_codes.data(), fp8_scales.data(), n, k, active_isa())
                          : pack_int4_weights(int4_codes.data(), int4_scales.data(), zeros.data(), n,
                                              k, 128, active_isa());
    w.int8_inputs = kind == "int4/int8";
    for (int64_t m : {1, 2, 4, 64}) {
      std::vector<bf16> x(size_t(m * k));
      for (auto& v : x) v = f32_to_bf16(float(int(rng() % 2001) - 1000) / 1000.0f);
      std::vector<float> y(size_t(m * n));
      double best = 1e9;
      for (int run = 0; run < 400; ++run) {
        const auto start = std::chrono::steady_clock::now();
        matmul(x.data(), m, k, w, y.data(), n, false, 0, 1);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      std::printf("%-16s %5lld %10.2f %10.1f %12.1f\n", kind.c_str(), (long long)m, best * 1e6,
                  double(m * n * k) / best * 1e-9, double(w.bytes) / best * 1e-9);
    }
  }
  // The FP32 small products (dot_rows: a MoE router, Qwen3.8-Flash-Next's hyper-connection mixes
  // and n-gram projections), over FP32 weights and over E4M3 codes widened in registers.
  std::vector<float> f32_weights(size_t(n * k)), fp8_factors(size_t(((n + 127) / 128) * ((k + 127) / 128)), 1.0f / 448);
  for (size_t i = 0; i < f32_weights.size(); ++i) f32_weights[i] = bf16_to_f32(bf16_weights[i]);
  for (const std::string kind : {"dot_rows f32", "dot_rows fp8"})
    for (int64_t m : {1, 4}) {
      std::vector<float> x(size_t(m * k)), y(size_t(m * n));
      for (auto& v : x) v = float(int(rng() % 2001) - 1000) / 1000.0f;
      double best = 1e9;
      for (int run = 0; run < 400; ++run) {
        const auto start = std::chrono::steady_clock::now();
        if (kind == "dot_rows f32") dot_rows_f32(x.data(), m, k, f32_weights.data(), n, k, y.data(), n);
        else dot_rows_fp8(x.data(), m, k, fp8_codes.data(), fp8_factors.data(), 0, n, k, y.data(), n);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      const double bytes = double(n * k) * (kind == "dot_rows f32" ? 4 : 1);
      std::printf("%-16s %5lld %10.2f %10.1f %12.1f\n", kind.c_str(), (long long)m, best * 1e6,
                  double(m * n * k) / best * 1e-9, bytes / best * 1e-9);
    }
  return 0;
}
