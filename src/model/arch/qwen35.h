#pragma once
// The hybrid Qwen3.5 / Qwen3.6 / Qwen3.8 generation (HF modeling_qwen3_5.py, qwen3_5_moe;
// docs/models/qwen35.md): three layers in four are Gated DeltaNet, with a recurrent state per
// slot, the others gated full attention with KV; the feed-forward is a SwiGLU MLP, or a sparse
// MoE block with a sigmoid-gated shared expert; every RMSNorm but the Gated DeltaNet output norm
// applies its weight as (1 + w). An optional multi-token-prediction head drafts tokens.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/blocks/attention.h"
#include "model/blocks/gated_deltanet.h"
#include "model/blocks/moe.h"
#include "model/blocks/mtp_head.h"
#include "model/blocks/swiglu.h"
#include "model/decoder.h"
#include "model/vision/vision_tower.h"

namespace ellm {

struct Qwen35Layer {
  Buffer<float> input_norm;  // [hidden]
  bool is_linear = false;    // Gated DeltaNet (linear_attn.*), else gated attention (self_attn.*)
  GatedDeltaNetWeights deltanet;
  AttentionWeights attention;  // q_proj [2 q_dim]: per head [query | gate]
  Buffer<float> post_attention_norm;  // [hidden]
  bool is_moe = false;
  SwiGluWeights mlp;  // dense: [2 intermediate][hidden], [hidden][intermediate]
  MoeWeights moe;     // MoE: router [num_experts][hidden], experts of moe_intermediate
  bool has_shared_expert = false;
  SharedExpertWeights shared_expert;  // [2 shared_expert_intermediate][hidden] ..., gate [hidden]
};

struct Qwen35Weights : DecoderWeights {
  std::vector<Qwen35Layer> layers;  // [num_hidden_layers], then the MTP head's layer if loaded
  MtpWeights mtp;
};

// The checkpoint in model_dir, checked against the config and packed for isa; with mtp, the
// multi-token-prediction head too (else mtp.* is not read).
Qwen35Weights load_qwen35_weights(const std::string& model_dir, const ModelConfig& config, Isa isa,
                                  bool quantize_fp8 = false, bool quantize_int4 = false,
                                  bool mtp = false, bool quantize_lm_head = false);

class Qwen35Model final : public Decoder {
 public:
  Qwen35Model(const std::string& model_dir, const ModelConfig& config, const ServingLimits& limits,
              std::shared_ptr<ThreadTeam> team);
  std::string kv_format() const override;
  bool has_mtp() const override { return limits_.mtp; }
  void mtp_forward(std::span<const BatchToken> tokens, float* logits) override;

 private:
  void layer(int64_t l, const PassRows& rows) override;
  void plan(ActivationPlan& plan) override;
  void after_pass(const PassRows& rows) override;
  void for_each_matrix(const MatrixFn& fn) override;
  void describe(std::string& load_line) const override;
  // x = fc(the MTP head's input rows), then the head's decoder layer over them.   x: [n][hidden]
  void mtp_layer(int64_t n, float* x, float* rope_cos, float* rope_sin);

  Qwen35Weights weights_;
  std::vector<int64_t> kv_layer_;     // [layers]  a layer's index among the KV layers (-1: none)
  std::vector<int64_t> state_layer_;  // [layers]  its index among the recurrent ones (-1: none)
  AttentionSpec attention_spec_;
  GatedDeltaNetSpec deltanet_spec_;
  MoeSpec moe_spec_;
  AttentionBuffers attention_;
  GatedDeltaNetBuffers deltanet_;
  SwiGluBuffers mlp_;
  MoeBuffers moe_;
  SharedExpertBuffers shared_;
  MtpHead mtp_;
};

// The config parser the registry calls (registry.cc).
void parse_qwen35_config(const nlohmann::json& j, const std::string& where, ModelConfig& c);

}  // namespace ellm
