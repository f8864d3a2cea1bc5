#pragma once
// The tower's row operations, each run on every member of a thread team: its products on the
// tier's BF16 matrix kernels (inputs BF16, sums FP32, as the decoder's), and the FP32 steps
// between them (LayerNorm with a bias, the two GELUs).
#include <cstdint>

#include "base/memory.h"
#include "base/threads.h"
#include "kernels/kernels.h"

namespace ellm {

struct VisionLinear {
  PackedWeights weight;  // [n][k]
  Buffer<float> bias;    // [n]
};

struct VisionNorm {
  Buffer<float> weight, bias;  // [dim]
};

// y = x @ W^T + bias, or y += that with accumulate. x [m][k] at stride ldx; y [m][n] at ldy.
void vision_linear(ThreadTeam& team, const bf16* x, int64_t m, int64_t ldx, const VisionLinear& w,
                   float* y, int64_t ldy, bool accumulate);

// out = bf16(LayerNorm(x) * weight + bias), rows [m][dim] contiguous, biased variance.
void layer_norm_to_bf16(ThreadTeam& team, const float* x, int64_t m, int64_t dim,
                        const VisionNorm& norm, float eps, bf16* out);

// out = bf16(gelu(x)), count values: the tanh approximation (gelu_pytorch_tanh, through x) or
// exact (erf).
void gelu_to_bf16(ThreadTeam& team, float* x, int64_t count, bool tanh_approximation, bf16* out);

// out = bf16(x), count values.
void to_bf16(ThreadTeam& team, const float* x, int64_t count, bf16* out);

}  // namespace ellm
