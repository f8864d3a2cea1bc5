#pragma once
// The n-gram per-layer embedding (HF Qwen4ExpTextPLELayer, "PLE"): at its layer, before the
// layer's blocks, a hash of each token and its predecessors picks rows of a huge table, and
// their concatenation is gated into every residual stream:
//   context  t0 = the token, t1 .. t_{n-1} its predecessors: EOS before the sequence start and
//            at or before an earlier EOS (an EOS token does not cut itself)
//   hash     mix_k = t0 m0 ^ t1 m1 ^ ... ^ t_{k-1} m_{k-1} (int64, never overflowing); heads
//            [heads_per_ngram] per n-gram size k = 2 .. n: row = mix_k % size_h + offset_h
//   emb      the heads' rows, concatenated                         [embed_dim]
//   key      = rmsnorm_s(W_key emb) * norm_key      per stream     [streams][hidden]
//   value    = W_value emb                                         [hidden]
//   q_s      = rmsnorm(X_s) * norm_query
//   s_s      = <key_s, q_s> / sqrt(hidden); gate_s = sigmoid(sign(s_s) sqrt(max(|s_s|, 1e-6)))
//   gv_s     = gate_s value;   c = silu(causal conv over time of rmsnorm_s(gv) * norm_conv:
//              depthwise, `taps` taps `dilation` (= n) tokens apart, no bias)
//   X_s      = X_s + gv_s + c_s
// The table stays in the mapped checkpoint (its shards, in order, as one table of BF16 rows, or
// of E4M3 rows with one scale for the whole table); a token reads its heads' rows only. Per
// slot the module keeps a sliding window of the last (taps - 1) dilation tokens
// (RecurrentShape::windows): each row holds a token's normed gv (the conv's history) and its id
// (the hash context). All FP32, the same code on every tier.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/blocks/context.h"
#include "model/load/mapped_table.h"
#include "model/load/tensor_loader.h"
#include "model/memory/sequence_memory.h"

namespace ellm {

struct NgramEmbeddingSpec {
  int64_t hidden = 0, streams = 0, embed_dim = 0;
  int64_t ngram_size = 0, heads_per_ngram = 0;
  int64_t conv_taps = 0;  // the conv's dilation is ngram_size
  int64_t vocab = 0;      // the token vocabulary (bounds the hash multipliers)
  int64_t table_base = 0, table_divisor = 1, seed = 0, module_index = 0;  // the hash constants
  int32_t eos = 0;
  float eps = 1e-6f;
  int64_t heads() const { return (ngram_size - 1) * heads_per_ngram; }
  int64_t row_dim() const { return embed_dim / heads(); }
  int64_t width() const { return streams * hidden; }
  // A slot's window: [history_rows][row_floats], oldest first; a row is the token's
  // rmsnorm(gv) [width], then its id (an int32 bit pattern).
  int64_t history_rows() const { return (conv_taps - 1) * ngram_size; }
  int64_t row_floats() const { return width() + 1; }
};

// The hash constants a config gives: per n-gram position an odd multiplier, per head its
// table size (the primes after table_base - 1) and offset, and the table's rows (padded).
struct NgramHash {
  std::vector<int64_t> multipliers, sizes, offsets;
  int64_t rows = 0;
};
NgramHash ngram_hash(const NgramEmbeddingSpec& spec);

struct NgramEmbeddingWeights {
  SmallMatrix key_proj;      // [streams hidden][embed_dim]
  SmallMatrix value_proj;    // [hidden][embed_dim]
  Buffer<float> norm_key, norm_query, norm_conv;  // [streams hidden]  (1 + w)
  Buffer<float> conv;        // [taps][streams hidden]
  NgramHash hash;
  // The table, in the mapped checkpoint: [shard rows][row_dim] elements of table_dtype each
  // (bf16, or f8_e4m3 whose values are code x table_scale).
  std::vector<const uint8_t*> shards;
  std::vector<int64_t> shard_start;  // [shards + 1]  the first table row of each
  Dtype table_dtype = Dtype::bf16;
  float table_scale = 1.0f;
  size_t row_bytes = 0;              // a row's bytes in the shards
  MappedTable table;                 // the shards' pages: residency, read-ahead, faults
};

// A table row (row_dim elements at `row`) as FP32 values, the same bits on every tier.
void widen_table_row(const NgramEmbeddingWeights& w, const uint8_t* row, int64_t row_dim, float* out);

// <prefix>key_proj, value_proj, norm_key, norm_query, norm_conv, conv1d (.weight); the table
// <prefix>ple_embedding.ngram_embedding.shard_K.weight, K = 0 .. `shards` - 1, mapped, not
// copied (E4M3 shards with the table's scale ple_embedding.ngram_embedding.weight_scale, one
// value); the int64 buffers ple_embedding.{layer_multipliers, ngram_heads_vocab_sizes,
// ngram_heads_offsets}, checked against the config's constants.
std::unique_ptr<NgramEmbeddingWeights> load_ngram_embedding(TensorLoader& load, const std::string& prefix,
                                           const NgramEmbeddingSpec& spec, int64_t shards);

struct NgramEmbeddingBuffers {
  float* emb;    // [T][embed_dim]
  float* key;    // [T][width]  the keys, then the conv's output
  float* value;  // [T][hidden]
  float* gated;  // [T][width]  gv
  float* normed; // [T][width]  the normed queries, then rmsnorm(gv)
  int32_t* context;  // [slots][8]  each slot's last token ids while a pass goes through its rows
  const uint8_t** row_at;  // [T][heads]  each head's table row
  uintptr_t* pages;        // [T][heads][2]  the pages to read ahead
  int32_t* seen;     // [slots]
};

void plan_ngram_embedding(ActivationPlan& plan, NgramEmbeddingBuffers& b,
                          const NgramEmbeddingSpec& spec, size_t max_tokens, size_t slots);

// x = x + the module's output over the rows (x: [n][width]); each token's slot window (sliding
// window `window` of the slot's state) moves past it, a token with a snapshot gets the state
// after it copied there, and a speculative token records its row for a rollback.
void ngram_embedding(BlockContext& ctx, const NgramEmbeddingSpec& spec, const NgramEmbeddingWeights& w,
                     SequenceMemory& memory, int64_t window, const PassRows& rows,
                     NgramEmbeddingBuffers& b);

}  // namespace ellm
