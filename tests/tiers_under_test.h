#pragma once
// The tiers a model or engine test runs on: every tier the machine has, or with
// ELLM_TEST_TIERS=best only the best one. The ASan run sets it (scripts/sanitize.sh): there the
// kernels' own tests still walk every tier's memory, and the model tests' numerics on each tier
// are the release run's job.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/cpu.h"

namespace ellm::test {

inline std::vector<Isa> tiers_under_test() {
  const char* only = std::getenv("ELLM_TEST_TIERS");
  if (only && std::strcmp(only, "best") == 0) return {best_isa()};
  return supported_isas();
}

}  // namespace ellm::test
