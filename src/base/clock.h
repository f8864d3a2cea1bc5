#pragma once
// A monotonic clock in seconds, for timing runs and measurements.
#include <chrono>

namespace ellm {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace ellm
