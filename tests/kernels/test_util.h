#pragma once
// Shared helpers for the kernel tests: deterministic random data and an ISA guard that restores
// the active tier after each use.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "base/threads.h"
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

// y = x . W^T (=|+= from y's values) in passes of `rows` rows of x's M, each run on every member
// of `team` sharing the work as decode does.
inline std::vector<float> matmul_in_passes(const bf16* x, int64_t M, int64_t ldx,
                                           const PackedWeights& w, std::vector<float> y,
                                           int64_t ldy, bool accumulate, int64_t rows,
                                           ThreadTeam& team) {
  alignas(64) std::atomic<int64_t> pool{0};
  for (int64_t r0 = 0; r0 < M; r0 += rows) {
    const int64_t m = std::min(rows, M - r0);
    pool.store(0);
    team.run([&](int member, int members) {
      matmul(x + r0 * ldx, m, ldx, w, y.data() + r0 * ldy, ldy, accumulate, member, members, &pool);
    });
  }
  return y;
}

inline std::vector<Isa> optimised_isas() {
  std::vector<Isa> out;
  for (Isa i : supported_isas())
    if (i != Isa::scalar) out.push_back(i);
  return out;
}

}  // namespace ellm
