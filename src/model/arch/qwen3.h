#pragma once
// Qwen3, dense and MoE (HF modeling_qwen3.py, modeling_qwen3_moe.py; docs/models/qwen3.md):
// every layer is attention then a SwiGLU MLP or a sparse MoE block, each behind an RMSNorm.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/blocks/attention.h"
#include "model/blocks/moe.h"
#include "model/blocks/swiglu.h"
#include "model/decoder.h"

namespace ellm {

struct Qwen3Layer {
  Buffer<float> input_norm;           // [hidden]
  AttentionWeights attention;         // q_proj [q_dim], k_proj, v_proj [kv_dim] x [hidden]
  Buffer<float> post_attention_norm;  // [hidden]
  bool is_moe = false;
  SwiGluWeights mlp;  // dense layers: [2 intermediate][hidden], [hidden][intermediate]
  MoeWeights moe;     // MoE layers: router [num_experts][hidden], experts of moe_intermediate
};

struct Qwen3Weights : DecoderWeights {
  std::vector<Qwen3Layer> layers;  // [num_hidden_layers]
};

// The checkpoint in model_dir, checked against the config and packed for isa.
Qwen3Weights load_qwen3_weights(const std::string& model_dir, const ModelConfig& config, Isa isa,
                                bool quantize_fp8 = false, bool quantize_int4 = false,
                                bool quantize_lm_head = false);

class Qwen3Model final : public Decoder {
 public:
  Qwen3Model(const std::string& model_dir, const ModelConfig& config, const ServingLimits& limits,
             std::shared_ptr<ThreadTeam> team);
  std::string kv_format() const override;

 private:
  void layer(int64_t l, const PassRows& rows) override;
  void plan(ActivationPlan& plan) override;
  void for_each_matrix(const MatrixFn& fn) override;

  Qwen3Weights weights_;
  AttentionSpec attention_spec_;
  MoeSpec moe_spec_;
  AttentionBuffers attention_;
  SwiGluBuffers mlp_;
  MoeBuffers moe_;
};

// The config parser the registry calls (registry.cc).
void parse_qwen3_config(const nlohmann::json& j, const std::string& where, ModelConfig& c);

}  // namespace ellm
