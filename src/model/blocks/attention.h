#pragma once
// Causal grouped-query self-attention over the static KV cache (HF Qwen3Attention), plain
// (Qwen3) or gated (Qwen3.5's full-attention layers: q_proj also yields a gate per query
// element, and the attention output is multiplied by its sigmoid before o_proj).
#include <cstdint>
#include <vector>

#include "model/blocks/context.h"
#include "model/load/tensor_loader.h"
#include "model/memory/kv_cache.h"

namespace ellm {

struct AttentionWeights {
  // [q_rows + 2 kv_dim][hidden]: q_proj, k_proj, v_proj rows. Gated: q_proj's rows are
  // 2 q_dim, each head's [query | gate]; plain: q_dim.
  PackedWeights qkv;
  Buffer<float> q_norm, k_norm;  // [head_dim]  (as the kernels multiply: Qwen3.5's 1 + w)
  PackedWeights o_proj;          // [hidden][q_dim]
};

struct AttentionSpec {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t rotary_dim = 0;  // RoPE on the first rotary_dim dims of each head (gated only)
  float eps = 1e-6f;       // of the q and k norms
  bool gated = false;
  bool bf16_products = false;  // AttentionShape::bf16_products
  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
  int64_t qkv_width() const { return (gated ? 2 : 1) * q_dim() + 2 * kv_dim(); }
};

struct AttentionBuffers {
  AttentionShape shape;  // what the attention kernels see
  float* qkv;            // [T][qkv_width]
  float* q;              // [T][q_dim]  gated: the normed, rotated queries apart from their gates
  float* out;            // [T][q_dim]
  float* scratch;
  std::vector<AttentionSeq> seqs;  // [T]
};

// <prefix>q_proj, k_proj, v_proj, o_proj (.weight) and q_norm, k_norm, read by `norm`.
AttentionWeights load_attention(TensorLoader& load, const std::string& prefix,
                                const AttentionSpec& spec, NormReader norm);

// The shape the kernels see and the buffers for passes of up to max_tokens tokens.
void plan_attention(ActivationPlan& plan, AttentionBuffers& b, const AttentionSpec& spec,
                    const KvCache& kv, int64_t max_tokens, int members);

// The two ends of the block, for an attention over other positions than the causal context
// (sparse_attention.h): qkv = xb @ [Wq; Wk; Wv]^T, q and k normed and rotated, k and v into the
// cache of `kv_layer`; and y (+)= o_proj(out) (gated: out * sigmoid(gate) first), xb its scratch.
void project_qkv_to_cache(BlockContext& ctx, const AttentionSpec& spec, const AttentionWeights& w,
                          KvCache& kv, int64_t kv_layer, const PassRows& rows, const bf16* xb,
                          AttentionBuffers& b);
void project_output(BlockContext& ctx, const AttentionSpec& spec, const AttentionWeights& w,
                    int64_t n, bf16* xb, AttentionBuffers& b, float* y, bool accumulate);

// x = x + o_proj(attention(rope(q_norm(q)), rope(k_norm(k)), v))    (gated: attention * sigmoid(gate))
// with q, k, v = xb @ [Wq; Wk; Wv]^T, xb = the normed rows; k and v go into the cache of
// `kv_layer` at each token's slot and position. xb is also the scratch for o_proj's input.
void self_attention(BlockContext& ctx, const AttentionSpec& spec, const AttentionWeights& w,
               KvCache& kv, int64_t kv_layer, const PassRows& rows, bf16* xb,
               AttentionBuffers& b);

}  // namespace ellm
