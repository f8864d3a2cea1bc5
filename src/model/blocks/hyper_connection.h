#pragma once
// Hyper-connections (HF Qwen4ExpTextGatedResidual): the residual is `streams` streams of hidden
// values per token, X [streams][hidden]. A block reads one mix of them and writes its output
// back into each stream with that stream's own weight:
//   Xn = rmsnorm(X_s) * norm                 per stream (the [streams hidden] gain covers all)
//   a  = silu(W_down Xn / streams)           [lowrank]
//   g  = sigmoid(W_up a)                     [streams hidden]
//   u  = mean over s of g_s * Xn_s           [hidden]: the block's input
//   w  = 2 sigmoid(W_inject Xn / streams)    [streams]
//   X_s = X_s + w_s * block(u)
// The final mixer is the same mix without W_inject; its u is the lm_head's input. All FP32 (the
// small products too, by dot_rows_f32 over the matrices widened from the checkpoint's dtype),
// so a row's result is the same bits on every tier and in any pass.
#include <cstdint>
#include <string>

#include "model/blocks/context.h"
#include "model/load/tensor_loader.h"

namespace ellm {

struct HyperConnectionSpec {
  int64_t hidden = 0, streams = 0, lowrank = 0;
  float eps = 1e-6f;
  int64_t width() const { return streams * hidden; }
};

struct HyperConnectionWeights {
  Buffer<float> norm;    // [streams hidden]  (1 + w)
  SmallMatrix down;      // [lowrank][streams hidden]
  SmallMatrix up;        // [streams hidden][lowrank]
  SmallMatrix inject;    // [streams][streams hidden]  (none in the final mixer)
};

// <prefix>hc_norm, input_mix_weight_down, input_mix_weight_up (.weight) and, with_inject,
// block_inject_weight.
HyperConnectionWeights load_hyper_connection(TensorLoader& load, const std::string& prefix,
                                             const HyperConnectionSpec& spec, bool with_inject);

struct HyperConnectionBuffers {
  float* xn;      // [T][streams hidden]  xn, a, g: a mix's own, free again once it returns
  float* a;       // [T][lowrank]
  float* g;       // [T][streams hidden]
  float* weight;  // [T][streams]  the write-back weights w, from a mix to its inject
};

// The write-back weights, live across the block between a mix and its inject.
void plan_hyper_weights(ActivationPlan& plan, HyperConnectionBuffers& b, const HyperConnectionSpec& spec,
                        size_t max_tokens);
// A mix's own scratch, which the block after it may share (ActivationPlan::overlay).
void plan_hyper_mix(ActivationPlan& plan, HyperConnectionBuffers& b, const HyperConnectionSpec& spec,
                    size_t max_tokens);

// u (and, with inject weights, the write-back weights) for n rows of X, on the team: a decode
// step's products split among the members by their weights' rows.
//                                                  x: [n][streams hidden]   u: [n][hidden]
void hyper_mix(BlockContext& ctx, const HyperConnectionSpec& spec, const HyperConnectionWeights& w,
               const float* x, int64_t n, HyperConnectionBuffers& b, float* u);
// X_s = X_s + w_s * y for n rows, w from the last hyper_mix.          y: [n][hidden]
void hyper_inject(BlockContext& ctx, const HyperConnectionSpec& spec, const HyperConnectionBuffers& b,
                  const float* y, int64_t n, float* x);

}  // namespace ellm
