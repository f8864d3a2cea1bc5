#pragma once
// The weights of a Qwen3 / Qwen3-MoE model as the forward pass uses them: GEMM matrices packed
// for one instruction set (Q/K/V fused into one matrix, gate/up into one), norms in FP32, the
// embedding table BF16 (left memory-mapped when the checkpoint is BF16).
#include <cstdint>
#include <string>
#include <vector>

#include "base/memory.h"
#include "kernels/kernels.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace ellm {

struct SwiGluWeights {
  PackedWeights gate_up;  // [2 * ffn][hidden]: rows [0, ffn) gate_proj, [ffn, 2 ffn) up_proj
  PackedWeights down;     // [hidden][ffn]
};

struct MoeWeights {
  Buffer<float> router;               // [num_experts][hidden], FP32 (the router runs in FP32)
  std::vector<SwiGluWeights> experts;  // each expert's matrices in their own contiguous buffers
  // Qwen3.5: x += sigmoid(shared_gate . xn) * shared(xn) beside the routed experts.
  bool has_shared = false;
  SwiGluWeights shared;
  Buffer<float> shared_gate;  // [hidden]
};

// A Gated DeltaNet layer (Qwen3.5 linear_attn).
struct GdnWeights {
  PackedWeights qkvz;      // [conv_dim + Hv dv][hidden]: in_proj_qkv rows, then in_proj_z
  PackedWeights ba;        // [2 Hv][hidden]: in_proj_b rows, then in_proj_a
  Buffer<float> conv;      // [taps][conv_dim]: conv1d.weight [conv_dim][1][taps] transposed
  Buffer<float> A_log;     // [Hv], FP32 whatever the checkpoint stores
  Buffer<float> dt_bias;   // [Hv]
  Buffer<float> norm;      // [dv], applied as stored (no +1)
  PackedWeights out_proj;  // [hidden][Hv dv]
};

// Norms hold the weight the kernels multiply by: for Qwen3.5 the stored w plus 1 (its (1 + w)
// RMSNorm), computed in FP32 at load.
struct LayerWeights {
  Buffer<float> input_norm, post_attention_norm;  // [hidden]
  Buffer<float> q_norm, k_norm;                   // [head_dim]
  // [q_dim + 2 kv_dim][hidden]: q_proj, k_proj, v_proj rows; Qwen3.5's q_proj rows are twice
  // as many, each head's [query | gate].
  PackedWeights qkv;
  PackedWeights o_proj;  // [hidden][q_dim]
  bool is_linear = false;  // a Gated DeltaNet layer: gdn instead of the attention weights
  GdnWeights gdn;
  bool is_moe = false;
  SwiGluWeights mlp;  // dense layers
  MoeWeights moe;     // MoE layers
};

// Qwen3.5's multi-token-prediction head (mtp.*): fc over [norm(embedding) | norm(hidden)], one
// decoder layer (ModelWeights::layers' last, after the model's own), a final norm; embeddings
// and lm_head are the model's.
struct MtpWeights {
  PackedWeights fc;                                // [hidden][2 hidden]
  Buffer<float> norm_embedding, norm_hidden, norm;  // [hidden], (1 + w)
};

struct ModelWeights {
  SafetensorsStore store;  // keeps the mapped embedding alive
  const bf16* embedding = nullptr;  // [vocab][hidden]
  Buffer<bf16> embedding_copy;      // when the checkpoint is not BF16
  Buffer<float> final_norm;         // [hidden]
  PackedWeights lm_head;            // [vocab][hidden] (packed from the embedding when tied)
  std::vector<LayerWeights> layers;  // with the MTP head: its decoder layer last
  MtpWeights mtp;
  size_t bytes = 0;         // packed matrices + embedding + norms
  size_t expert_bytes = 0;  // all experts of all layers (part of bytes)
  size_t fp8_bytes = 0;     // the FP8 matrices' codes and factors (part of bytes)
  size_t int4_bytes = 0;    // the INT4 matrices' codes, factors and zeros (part of bytes)
};

// The FP8 quantisation rule of quantize_fp8 and `make-model --dtype fp8`: a 128x128 block's
// factor from its largest magnitude (1 for an all-zero block), and each value's code.
inline float fp8_block_factor(float max_magnitude) {
  return max_magnitude > 0 ? max_magnitude / 448.0f : 1.0f;
}
inline uint8_t fp8_quantise(float value, float factor) { return f32_to_fp8_e4m3(value / factor); }

// Opens the checkpoint in model_dir, checks every tensor against the config and packs for isa.
// Pages of the mapped checkpoint are released as each tensor is packed. A linear weight stored
// as F8_E4M3 with its weight_scale_inv beside it stays FP8; with quantize_fp8, the decoder
// layers' other linear weights are converted to FP8 too (per 128x128 block of each tensor:
// factor = max |w| / 448, codes rounded to nearest even), one tensor at a time, so the BF16
// copy is never held whole. Embeddings, lm_head, norms and the router stay as they are.
// A module stored 4-bit (GPTQ, AWQ: <module>.qweight) stays INT4 (int4_weights.h); with
// quantize_int4 the decoder layers' other linear weights are quantised to INT4 (groups of 128),
// and lm_head too with quantize_lm_head. With mtp, the MTP head too (else mtp.* is not read).
ModelWeights load_weights(const std::string& model_dir, const ModelConfig& config, Isa isa,
                          bool quantize_fp8 = false, bool quantize_int4 = false, bool mtp = false,
                          bool quantize_lm_head = false);

// fn(PackedWeights&) on every matrix of the model, lm_head and the MTP head included.
template <class Fn>
void for_each_matrix(ModelWeights& m, Fn&& fn) {
  auto swiglu = [&](SwiGluWeights& s) {
    fn(s.gate_up);
    fn(s.down);
  };
  for (LayerWeights& L : m.layers) {
    for (PackedWeights* w : {&L.qkv, &L.o_proj, &L.gdn.qkvz, &L.gdn.ba, &L.gdn.out_proj}) fn(*w);
    swiglu(L.mlp);
    for (SwiGluWeights& e : L.moe.experts) swiglu(e);
    swiglu(L.moe.shared);
  }
  fn(m.mtp.fc);
  fn(m.lm_head);
}

// --activations int8 (model.h): the INT4 matrices' products quantise their inputs to int8.
inline void set_int8_inputs(ModelWeights& m, bool on) {
  for_each_matrix(m, [&](PackedWeights& w) { w.int8_inputs = on && w.int4; });
}

}  // namespace ellm
