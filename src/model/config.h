#pragma once
// config.json of a Hugging Face Qwen3 (dense) or Qwen3-MoE model.
#include <cstdint>
#include <string>
#include <vector>

namespace ellm {

// 4-bit checkpoints (quantization_config, int4_config.cc): which layout the tensors use.
struct Int4Quantization {
  std::string format;       // "gptq" (zero points stored minus 1), "gptq_v2" or "awq"; "" if none
  int64_t group_size = 0;   // inputs per factor; -1 (GPTQ): one group over all inputs
};

struct ModelConfig {
  std::string architecture;  // Qwen3ForCausalLM or Qwen3MoeForCausalLM
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // from the config, not hidden / heads (they differ in Qwen3-0.6B)
  int64_t intermediate_size = 0;  // dense MLP
  int64_t max_position_embeddings = 0;
  double rope_theta = 1000000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  // Mixture of experts (Qwen3-MoE); num_experts == 0 for dense models.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  // quantization_config.quant_method: "fp8" (E4M3 linear weights, one factor per 128x128 block,
  // dynamic activations: Qwen's FP8 checkpoints), "gptq" or "awq" (4-bit, `int4`) or "" (none).
  // The loader goes by each tensor's own dtype (or a module's .qweight) either way.
  std::string quant_method;
  Int4Quantization int4;

  bool is_moe_layer(int64_t layer) const;
  bool is_moe() const { return num_experts > 0; }
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
};

// Parses and validates JSON text; `where` names the file in error messages.
ModelConfig parse_model_config(const std::string& json_text, const std::string& where);
// Reads <model_dir>/config.json.
ModelConfig load_model_config(const std::string& model_dir);
// The config.json text for a config (the keys Hugging Face writes); the special token ids only
// when given (>= 0): they come from the tokenizer files.
std::string model_config_json(const ModelConfig& config, int32_t bos_token_id = -1,
                              int32_t eos_token_id = -1);

}  // namespace ellm
