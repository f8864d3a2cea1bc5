#pragma once
// Qwen3.8-Flash-Next (HF modeling_qwen4_exp.py, model_type qwen4_exp or qwen3_8_flash_next;
// docs/models/qwen4exp.md): the Qwen3.5 hybrid stack (three Gated DeltaNet layers in four, with
// a sigmoid output gate; MoE with a sigmoid-gated shared expert in every layer) with
//   - hyper-connections: a residual of hc_count streams per token; every block reads a mix of
//     them and writes back into each (hyper_connection.h), a final mixer in place of the norm;
//   - Qwen Sparse Attention in the full-attention layers: an indexer keeps, per query, the best
//     blocks of past positions (sparse_attention.h);
//   - the n-gram per-layer embedding at its layers (ngram_embedding.h), its table left in the
//     mapped checkpoint.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/blocks/gated_deltanet.h"
#include "model/blocks/hyper_connection.h"
#include "model/blocks/moe.h"
#include "model/blocks/ngram_embedding.h"
#include "model/blocks/sparse_attention.h"
#include "model/decoder.h"

namespace ellm {

// The text config's fields beyond ModelConfig's.
struct Qwen4ExpConfig {
  int64_t hc_count = 0, hc_lowrank = 0;          // residual streams; the mix's inner width
  std::vector<int64_t> ple_layers;               // zero-indexed (ple_layer_ids are one-indexed)
  int64_t ple_embed_dim = 0, ngram_size = 0, heads_per_ngram = 0;
  int64_t ngram_vocab_size_base = 0, ngram_vocab_divisor = 1, split_ngram_parts = 0;
  int64_t seed = 0, ple_conv_kernel_size = 0;
  int64_t indexer_heads = 0, indexer_head_dim = 0, indexer_budget = 0, indexer_ratio = 0;
  bool sigmoid_gate = true;  // output_gate_type "sigmoid" (else "silu")
  int32_t eos = 0;           // the hash context's reset token (eos_token_id, the first if a list)
};

// Reads the text config (the nested text_config of a wrapper): fills c, returns the rest.
Qwen4ExpConfig parse_qwen4exp_fields(const nlohmann::json& config_json, const std::string& where,
                                     ModelConfig& c);

struct Qwen4ExpLayer {
  NgramEmbeddingWeights* ple = nullptr;  // at the PLE layers only (owned by Qwen4ExpWeights)
  HyperConnectionWeights attn_hc;   // norm [hc hidden], down [lowrank][hc hidden], up, inject [hc][hc hidden]
  bool is_linear = false;           // Gated DeltaNet (linear_attn.*), else QSA (self_attn.*)
  GatedDeltaNetWeights deltanet;
  SparseAttentionWeights attention;  // q_proj [2 q_dim] per head [query | gate]; indexer
  HyperConnectionWeights mlp_hc;
  MoeWeights moe;                    // router [experts][hidden], fused experts
  SharedExpertWeights shared_expert;  // [2 shared][hidden], [hidden][shared], gate [hidden]
};

struct Qwen4ExpWeights : DecoderWeights {
  std::vector<Qwen4ExpLayer> layers;                      // [num_hidden_layers]
  std::vector<std::unique_ptr<NgramEmbeddingWeights>> ple;  // one per PLE layer
  HyperConnectionWeights mixer;                           // the final one (no inject)
};

class Qwen4ExpModel final : public Decoder {
 public:
  Qwen4ExpModel(const std::string& model_dir, const ModelConfig& config, const Qwen4ExpConfig& extra,
                const ServingLimits& limits, std::shared_ptr<ThreadTeam> team);
  // The fields beyond ModelConfig's read from model_dir's config.json again.
  Qwen4ExpModel(const std::string& model_dir, const ModelConfig& config, const ServingLimits& limits,
                std::shared_ptr<ThreadTeam> team);
  std::string kv_format() const override;

 private:
  void layer(int64_t l, const PassRows& rows) override;
  void plan(ActivationPlan& plan) override;
  void for_each_matrix(const MatrixFn& fn) override;
  void describe(std::string& load_line) const override;
  MappedTableStatus mapped_table() const override;
  void evict_mapped_table() override;
  void lm_head_input(const float* x, const int32_t* rows, int64_t n) override;
  // u = bf16 copy of the block input in normed_ (xn holds it in FP32).
  void block_input(const HyperConnectionWeights& hc, const PassRows& rows);

  Qwen4ExpConfig extra_;
  Qwen4ExpWeights weights_;
  std::vector<int64_t> kv_layer_, state_layer_, ple_index_;  // [layers]  -1: none
  HyperConnectionSpec hc_spec_;
  SparseAttentionSpec qsa_spec_;
  GatedDeltaNetSpec deltanet_spec_;
  MoeSpec moe_spec_;
  NgramEmbeddingSpec ple_spec_;
  HyperConnectionBuffers hc_;
  SparseAttentionBuffers qsa_;
  GatedDeltaNetBuffers deltanet_;
  MoeBuffers moe_;
  SharedExpertBuffers shared_;
  NgramEmbeddingBuffers ple_;
  float* block_out_ = nullptr;  // [T][hidden]  a block's output before the write-back
  float* final_x_ = nullptr;    // [T][hc_count hidden]  the residual rows that want logits
};

// The config parser the registry calls (registry.cc).
void parse_qwen4exp_config(const nlohmann::json& j, const std::string& where, ModelConfig& c);

}  // namespace ellm
