#include "model/load/int4_activations.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <vector>

#include "base/clock.h"
#include "base/cpu.h"
#include "kernels/kernels.h"

namespace ellm {
namespace {

constexpr int64_t kRows = 2048, kInputs = 1024, kGroup = 128;
constexpr int64_t kPrefillRows = 32;
constexpr int kRounds = 5;

// A random INT4 matrix: the kernels' cost does not depend on the values.
PackedWeights timing_matrix() {
  PackedWeights w = make_int4_weights(kRows, kInputs, kGroup, active_isa());
  uint32_t state = 12345;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  for (int64_t b = 0; b < kRows * kInputs / 2; ++b) w.codes[size_t(b)] = uint8_t(next() >> 24);
  for (int64_t i = 0; i < kRows * (kInputs / kGroup); ++i) {
    w.scales[size_t(i)] = 1.0f / 64;
    w.zeros[size_t(i)] = uint8_t(next() >> 28);
  }
  return w;
}

Int4ActivationChoice measure() {
  PackedWeights w = timing_matrix();
  std::vector<bf16> x(size_t(kPrefillRows * kInputs));
  for (size_t i = 0; i < x.size(); ++i) x[i] = f32_to_bf16(float(int(i * 7919 % 2001) - 1000) / 1000.0f);
  std::vector<float> y(size_t(kPrefillRows * kRows));
  // Best of kRounds for each, the two kinds of inputs alternating so that both meet the same
  // moments of a shared machine.
  auto seconds_of = [&](int64_t rows, bool int8) {
    w.int8_inputs = int8;
    const double start = now_seconds();
    matmul(x.data(), rows, kInputs, w, y.data(), kRows, false, 0, 1);
    return now_seconds() - start;
  };
  double seconds[2][2];  // [rows: one, tile][inputs: bf16, int8]
  for (auto& r : seconds) r[0] = r[1] = std::numeric_limits<double>::infinity();
  for (int round = 0; round <= kRounds; ++round)  // round 0 warms the caches up
    for (int tile = 0; tile < 2; ++tile)
      for (int int8 = 0; int8 < 2; ++int8) {
        const double t = seconds_of(tile ? kPrefillRows : 1, int8 == 1);
        if (round > 0) seconds[tile][int8] = std::min(seconds[tile][int8], t);
      }
  Int4ActivationChoice choice;
  choice.measured = true;
  choice.decode_speedup = seconds[0][0] / seconds[0][1];
  choice.prefill_speedup = seconds[1][0] / seconds[1][1];
  choice.dtype = faster_int4_activations(choice.decode_speedup, choice.prefill_speedup);
  return choice;
}

}  // namespace

ActivationDtype faster_int4_activations(double decode_speedup, double prefill_speedup) {
  return decode_speedup > 1.0 && prefill_speedup >= 0.9 ? ActivationDtype::int8 : ActivationDtype::bf16;
}

Int4ActivationChoice choose_int4_activations() {
  const Isa isa = active_isa();
  Int4ActivationChoice choice;
  if (isa == Isa::scalar) return choice;
  if (isa >= Isa::avx512 || avx_vnni_enabled()) {
    choice.dtype = ActivationDtype::int8;
    return choice;
  }
  static std::mutex mutex;
  static std::map<Isa, Int4ActivationChoice> measured;
  std::lock_guard lock(mutex);
  auto it = measured.find(isa);
  if (it == measured.end()) it = measured.emplace(isa, measure()).first;
  return it->second;
}

}  // namespace ellm
