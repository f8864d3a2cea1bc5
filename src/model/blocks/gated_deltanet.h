#pragma once
// The Gated DeltaNet mixer (HF Qwen3_5GatedDeltaNet), the linear-attention layers of the hybrid
// Qwen3.5 generation:
//   [qkv | z] = xn W_qkvz^T, [b | a] = xn W_ba^T
//   q | k | v = silu(causal_conv1d(qkv)); q = l2norm(q) / sqrt(dk); k = l2norm(k)
//   beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias)
//   o = delta_rule(q, k, v, beta, g)        per value head, over the slot's recurrent state
//   x = x + out_proj(rmsnorm(o) * silu(z))      (sigmoid(z) with sigmoid_gate: Qwen3.8-Flash-Next)
// Value head j reads q/k head j / (Hv / Hk). Each slot's conv window and delta-rule state carry
// the sequence from its earlier passes (and parts) into this one.
#include <cstdint>
#include <vector>

#include <string>

#include "model/blocks/context.h"
#include "model/load/tensor_loader.h"
#include "model/memory/sequence_memory.h"

namespace ellm {

struct GatedDeltaNetWeights {
  PackedWeights qkvz;      // [conv_dim + Hv dv][hidden]: in_proj_qkv rows, then in_proj_z
  PackedWeights ba;        // [2 Hv][hidden]: in_proj_b rows, then in_proj_a
  Buffer<float> conv;      // [taps][conv_dim]: conv1d.weight [conv_dim][1][taps] transposed
  Buffer<float> A_log;     // [Hv], FP32 whatever the checkpoint stores
  Buffer<float> dt_bias;   // [Hv]
  Buffer<float> norm;      // [dv], applied as stored (no +1)
  PackedWeights out_proj;  // [hidden][Hv dv]
};

struct GatedDeltaNetSpec {
  int64_t hidden = 0, key_heads = 0, value_heads = 0, dk = 0, dv = 0, conv_taps = 0;
  float eps = 1e-6f;  // of the output norm
  bool sigmoid_gate = false;  // the output norm's gate: sigmoid(z) (output_gate_type), else silu(z)
  int64_t conv_dim() const { return 2 * key_heads * dk + value_heads * dv; }  // q | k | v
  int64_t value_dim() const { return value_heads * dv; }
};

// <prefix>in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, A_log, dt_bias, norm, out_proj.
GatedDeltaNetWeights load_gated_deltanet(TensorLoader& load, const std::string& prefix,
                                         const GatedDeltaNetSpec& spec);

// Consecutive tokens [begin, begin + count) of one slot in a pass; `next` is the slot's next
// run in the same pass (-1: none).
struct SlotRun {
  int32_t slot, begin, count, next;
};

struct GatedDeltaNetBuffers {
  float* qkvz;     // [T][CD + VD]  in_proj_qkv | in_proj_z      (CD = conv_dim, VD = Hv dv)
  float* ba;       // [T][2 Hv]     in_proj_b | in_proj_a
  float* u;        // [T][CD]       conv + SiLU: q | k | v (q, k then L2-normed)
  float* g;        // [T][Hv]       log decay
  float* beta;     // [T][Hv]
  float* o;        // [T][VD]       delta-rule output, then its gated norm
  float* delta_scratch;             // [members][gated_delta_chunk_scratch_floats]
  std::vector<SlotRun> runs;        // [T]  runs of consecutive tokens of one slot
  std::vector<int32_t> first_runs;  // [T]  the first run of each slot in the pass
};

void plan_gated_deltanet(ActivationPlan& plan, GatedDeltaNetBuffers& b, const GatedDeltaNetSpec& spec,
                         size_t max_tokens, int members);

// x = x + the mixer's output over the rows, from xb = the normed rows; the state of recurrent
// layer `state_layer` of each token's slot moves past its tokens (a token with a `snapshot`
// gets the state after it copied there). xb is also the scratch for out_proj's input.
void gated_deltanet(BlockContext& ctx, const GatedDeltaNetSpec& spec, const GatedDeltaNetWeights& w,
                    SequenceMemory& memory, int64_t state_layer, const PassRows& rows, bf16* xb,
                    GatedDeltaNetBuffers& b);

// Below this many tokens of one slot the recurrence costs less than a chunk (bench_gdn: a token
// of a 128 x 128 head takes 2.3 us, a chunk of 17 tokens 21 us and one of 64 tokens 64 us). A
// group of speculative tokens must stay within it, so that its rows equal decode's and a
// rollback replays the same steps.
constexpr int64_t kRecurrentRun = 16;

}  // namespace ellm
