#pragma once
// The sparse mixture-of-experts block (HF Qwen3MoeSparseMoeBlock):
//   router_logits = xn @ Wrouter^T; p = softmax(router_logits) in FP32; top-k of p,
//   renormalised when norm_topk_prob; x += sum_k p_k * expert_k(xn)      (each a SwiGLU)
// and Qwen3.5's sigmoid-gated shared expert beside it:
//   x += sigmoid(xn . w_gate) * shared(xn)
// Tokens are regrouped by expert so that each selected expert's weights are read once per
// tile of up to kMoeTileTokens tokens, for all of that tile's tokens; experts nobody chose are
// never touched.
#include <cstdint>
#include <vector>

#include "model/blocks/swiglu.h"

namespace ellm {

struct MoeWeights {
  Buffer<float> router;                // [num_experts][hidden], FP32 (the router runs in FP32)
  std::vector<SwiGluWeights> experts;  // each expert's matrices in their own contiguous buffers
};

struct SharedExpertWeights {
  SwiGluWeights mlp;
  Buffer<float> gate;  // [hidden], FP32
};

// A pass runs its tokens through the experts this many at a time. The per-choice rows cost
// top_k x (2 hidden + 3 ffn) values a token (215 KiB on Qwen3.8-Flash-Next: 7 GiB for a 32k
// pass); a tile's tokens still give each expert about tile x top_k / experts rows (80 there), so
// the weights read again per tile cost little beside the tile's products.
constexpr int64_t kMoeTileTokens = 4096;

struct MoeSpec {
  int64_t hidden = 0, experts = 0, top_k = 0, ffn = 0;  // ffn: one expert's
  bool norm_topk_prob = false;
};

// <prefix>gate (the router) and the experts: one tensor each (<prefix>experts.E.gate_proj ...,
// as Qwen3 and Qwen's FP8 checkpoints store them) or fused into 3-D tensors
// (<prefix>experts.gate_up_proj, down_proj: Qwen3.5's BF16 checkpoints). Adds the experts' bytes
// to expert_bytes; `layer` names the layer in errors.
MoeWeights load_moe(TensorLoader& load, const std::string& prefix, const MoeSpec& spec,
                    int64_t layer, size_t& expert_bytes);
// <prefix>shared_expert.* and <prefix>shared_expert_gate.weight.
SharedExpertWeights load_shared_expert(TensorLoader& load, const std::string& prefix,
                                       int64_t hidden, int64_t ffn);

struct MoeBuffers {                  // T: the tile, at most kMoeTileTokens
  float* router_logits;              // [T][experts]
  int32_t* topk_expert;              // [T][top_k]
  float* topk_weight;                // [T][top_k]
  int32_t* row_of_choice;            // [T][top_k]  the grouped row holding that choice
  int32_t* token_of_row;             // [T top_k]
  std::vector<int64_t> expert_rows;  // [experts + 1]  first grouped row of each expert
  bf16* in;                          // [T top_k][hidden]
  float* gate_up;                    // [T top_k][2 ffn]
  bf16* act;                         // [T top_k][ffn]
  float* out;                        // [T top_k][hidden]
};

struct SharedExpertBuffers {
  SwiGluBuffers mlp;  // [T][2 shared ffn]
  float* out;         // [T][hidden]
};

void plan_moe(ActivationPlan& plan, MoeBuffers& b, const MoeSpec& spec, size_t max_tokens);
void plan_shared_expert(ActivationPlan& plan, SharedExpertBuffers& b, size_t max_tokens,
                        size_t hidden, size_t ffn);

// x += the routed experts' outputs over n rows, from the normed rows (xn FP32, xb BF16).
void moe(BlockContext& ctx, const MoeSpec& spec, const MoeWeights& w, const NormedRows& normed,
         int64_t n, MoeBuffers& b, float* x);
// x += the shared expert's output over n rows; xb is also its scratch (after moe() is done
// with it).
void shared_expert(BlockContext& ctx, const SharedExpertWeights& w, const NormedRows& normed,
                   int64_t n, int64_t H, SharedExpertBuffers& b, float* x);

}  // namespace ellm
