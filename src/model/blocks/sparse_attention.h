#pragma once
// Qwen Sparse Attention (HF Qwen4ExpTextAttention with its Qwen4ExpTextQSAIndexer): gated GQA
// attention (attention.h) over the positions a small indexer keeps for each query, not over the
// whole causal context:
//   q_i = rope(rmsnorm(Wq_i u) * q_layernorm)        i < index_heads      (FP32)
//   k_t = Wk u_t                                     the raw key, cached per position
//   kb  = rope(rmsnorm(mean(k_4b .. k_4b+3)) * k_layernorm, at position 4b's rope position)
//         once per complete block b of `ratio` positions, cached at the block's last position
//   score_b = sum_i relu(q_i . kb) / sqrt(index_dim)   for the complete blocks up to the query
//   kept    = the top budget / ratio blocks (ties: the earlier block) + the incomplete tail
//   y = o_proj(attention(q, K, V over kept) * sigmoid(gate))
// With up to budget + ratio - 1 positions of context this is dense causal attention. The KV
// cache's extra values per position hold [raw key | block key | rope position] (2 index_dim
// floats, then the position's (T, H, W) rope position and a spare: a block's first position may
// be an image token of an earlier pass, whose multimodal rope position the block key turns with).
#include <cstdint>
#include <string>
#include <vector>

#include "model/blocks/attention.h"
#include "model/rope.h"

namespace ellm {

constexpr int64_t kMaxIndexHeads = 64;

struct SparseAttentionSpec {
  AttentionSpec attention;  // gated
  int64_t index_heads = 0, index_dim = 0, budget = 0, ratio = 0;
  int64_t top_blocks() const { return budget / ratio; }
  int64_t max_kept() const { return budget + ratio - 1; }
  int64_t index_width() const { return (index_heads + 1) * index_dim; }  // the queries, then the key
  int64_t cache_floats() const { return 2 * index_dim + 4; }            // per position
};

struct SparseAttentionWeights {
  AttentionWeights attention;
  SmallMatrix index_proj;               // [(index_heads + 1) index_dim][hidden]  index_qk_proj
  Buffer<float> q_layernorm, k_layernorm;  // [index_dim]  (1 + w)
};

// <prefix>{q,k,v,o}_proj, q_norm, k_norm and <prefix>indexer.{index_qk_proj, q_layernorm,
// k_layernorm}.
SparseAttentionWeights load_sparse_attention(TensorLoader& load, const std::string& prefix,
                                             const SparseAttentionSpec& spec);

struct SparseAttentionBuffers {
  AttentionBuffers attention;  // its scratch unused: the kept rows' shape has its own
  AttentionShape kept_shape;   // the attention kernels' shape over kept rows
  float* index;    // [T][index_width]
  // Per member (a short pass: per row): the block scores, their order, and the kept positions'
  // K and V rows.
  float* scores;     // [members][max blocks]
  int32_t* order;    // [members][max blocks]
  uint8_t* kept_k;   // [members][max_kept][KV row bytes]
  uint8_t* kept_v;
  float* member_scratch;  // [members][member_scratch_floats]  a member's attention alone
  float* shared_scratch;  // the members' attention together (a short pass)
  size_t member_scratch_floats = 0;
  std::vector<AttentionSeq> seqs;  // [T]
  int64_t max_blocks = 0;
};

void plan_sparse_attention(ActivationPlan& plan, SparseAttentionBuffers& b, const SparseAttentionSpec& spec,
                           const KvCache& kv, int64_t max_tokens, int64_t max_positions, int members);

// y = the block's output over the rows ([n][hidden], overwritten), from the block input u (FP32,
// the indexer's) and xb = bf16(u) (also the scratch for o_proj's input). K, V and the indexer's
// keys of the rows go into the cache of `kv_layer`. rope: the RoPE frequencies and attention
// factor, for the block keys' positions.
void sparse_attention(BlockContext& ctx, const SparseAttentionSpec& spec, const SparseAttentionWeights& w,
                      KvCache& kv, int64_t kv_layer, const PassRows& rows, const float* u, bf16* xb,
                      const RopeTable& rope, SparseAttentionBuffers& b, float* y);

}  // namespace ellm
