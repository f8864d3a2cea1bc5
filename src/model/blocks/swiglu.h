#pragma once
// The SwiGLU feed-forward network (HF Qwen3MLP): down(silu(gate(x)) * up(x)). It is the dense
// layers' MLP, each MoE expert and Qwen3.5's shared expert.
#include <cstdint>

#include <string>

#include "model/blocks/context.h"
#include "model/load/tensor_loader.h"

namespace ellm {

struct SwiGluWeights {
  PackedWeights gate_up;  // [2 ffn][hidden]: rows [0, ffn) gate_proj, [ffn, 2 ffn) up_proj
  PackedWeights down;     // [hidden][ffn]
};

// <prefix>gate_proj, up_proj, down_proj (.weight).
SwiGluWeights load_swiglu(TensorLoader& load, const std::string& prefix, int64_t hidden, int64_t ffn);

struct SwiGluBuffers {
  float* gate_up;  // [T][2 ffn]
};

inline void plan_swiglu(ActivationPlan& plan, SwiGluBuffers& b, size_t max_tokens, size_t ffn) {
  plan.carve(b.gate_up, max_tokens * 2 * ffn);
}

// Rows [begin, end) of gate_up ([n][2 F]: gate | up) to act = bf16(silu(gate) * up) ([n][F]);
// the FP32 product is written over the gate half.
void silu_mul_to_bf16(float* gate_up, int64_t begin, int64_t end, int64_t F, bf16* act);

// y (+)= down(silu(gate(xb)) * up(xb)) over n rows                xb: [n][H], y: [n][H]
// xb is also the scratch for the activation's BF16 copy ([n][ffn]).
void swiglu(BlockContext& ctx, const SwiGluWeights& w, bf16* xb, int64_t n, int64_t H,
            SwiGluBuffers& buffers, float* y, bool accumulate);

}  // namespace ellm
