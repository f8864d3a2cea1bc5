#pragma once
// Shared helpers for the kernel tests: deterministic random data and an ISA guard that restores
// the active tier after each use.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "kernels/kernels.h"

namespace ellm {

inline std::vector<float> random_floats(size_t count, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<bf16> random_bf16(size_t count, uint32_t seed, float lo = -1, float hi = 1) {
  std::vector<bf16> v(count);
  auto f = random_floats(count, seed, lo, hi);
  for (size_t i = 0; i < count; ++i) v[i] = f32_to_bf16(f[i]);
  return v;
}

inline std::vector<f16> random_f16(size_t count, uint32_t seed, float lo = -1, float hi = 1) {
  std::vector<f16> v(count);
  auto f = random_floats(count, seed, lo, hi);
  for (size_t i = 0; i < count; ++i) v[i] = f32_to_f16(f[i]);
  return v;
}

// Sets the active ISA for its lifetime.
class IsaScope {
 public:
  explicit IsaScope(Isa isa) : saved_(active_isa()) { set_active_isa(isa); }
  ~IsaScope() { set_active_isa(saved_); }

 private:
  Isa saved_;
};

inline std::vector<Isa> optimised_isas() {
  std::vector<Isa> out;
  for (Isa i : supported_isas())
    if (i != Isa::scalar) out.push_back(i);
  return out;
}

}  // namespace ellm
