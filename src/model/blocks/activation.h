#pragma once
// The scalar activations the blocks apply row by row (gates, routers, the hyper-connections).
#include <cmath>

namespace ellm {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace ellm
