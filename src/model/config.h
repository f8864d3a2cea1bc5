#pragma once
// config.json of a Hugging Face model, as every architecture reads it: the fields they share,
// and each architecture's own (its parser in arch/, picked by model_type in registry.cc). The
// fields of each architecture are described in docs/models/.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace ellm {

// 4-bit checkpoints (quantization_config, int4_config.cc): which layout the tensors use.
struct Int4Quantization {
  std::string format;       // "gptq" (zero points stored minus 1), "gptq_v2" or "awq"; "" if none
  int64_t group_size = 0;   // inputs per factor; -1 (GPTQ): one group over all inputs
};

// RoPE scaling (rope_scaling / rope_parameters, or --rope-scaling): YaRN as transformers computes
// it (_compute_yarn_parameters), static over the whole sequence; rope.h derives the frequencies.
struct RopeScaling {
  std::string type = "default";  // "default" or "yarn"
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // the pre-YaRN window; 0: max_position_embeddings
  double beta_fast = 32, beta_slow = 1;
  double attention_factor = 1.0;  // multiplies cos and sin of the rotated dims (resolved)
  bool truncate = true;           // round the correction range outwards to whole dims
  bool is_yarn() const { return type == "yarn"; }
};

struct ModelConfig {
  std::string architecture;  // Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen3_5...
  std::string model_type;    // qwen3, qwen3_moe, qwen3_5, qwen3_5_moe, qwen3_5_moe_text
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // from the config, not hidden / heads (they differ in Qwen3-0.6B)
  int64_t intermediate_size = 0;  // dense MLP
  int64_t max_position_embeddings = 0;
  double rope_theta = 1000000.0;
  RopeScaling rope_scaling;
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

  // Hybrid models (Qwen3.5+). linear_attention[l]: layer l is Gated DeltaNet, else gated full
  // attention (q_proj per head [query | gate]); empty for Qwen3. Every RMSNorm but the GDN
  // output norm applies its weight as (1 + w).
  std::vector<bool> linear_attention;
  int64_t linear_num_key_heads = 0, linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0, linear_value_head_dim = 0;
  int64_t linear_conv_kernel_dim = 0;
  double partial_rotary_factor = 1.0;  // RoPE on the first head_dim * factor dims only
  // Multimodal RoPE (Qwen3.5+ rope_parameters): how many rotary frequencies turn with an image
  // token's T, H and W position; interleaved (THWTHW..., then T) or in three runs. All zero: none
  // (text tokens have T = H = W, so the split only matters for images).
  std::array<int64_t, 3> mrope_section{};
  bool mrope_interleaved = false;
  int32_t image_token_id = -1;  // <|image_pad|> of a vision-language checkpoint (config.json)
  int64_t shared_expert_intermediate_size = 0;  // sigmoid-gated shared expert (0: none)

  bool is_moe_layer(int64_t layer) const;
  bool is_moe() const { return num_experts > 0; }
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  bool is_hybrid() const { return !linear_attention.empty(); }
  bool is_linear_layer(int64_t layer) const { return is_hybrid() && linear_attention[layer]; }
  int64_t rotary_dim() const { return int64_t(double(head_dim) * partial_rotary_factor); }
  // The longest sequence the model is meant for: with YaRN, the original window times the factor
  // (or max_position_embeddings, if larger).
  int64_t context_window() const;
  // Gated DeltaNet: the conv channels (q | k | v) and the value width (z, the output).
  int64_t conv_dim() const {
    return 2 * linear_num_key_heads * linear_key_head_dim + linear_num_value_heads * linear_value_head_dim;
  }
  int64_t linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
};

// Parses and validates JSON text; `where` names the file in error messages.
ModelConfig parse_model_config(const std::string& json_text, const std::string& where);
// Reads <model_dir>/config.json.
ModelConfig load_model_config(const std::string& model_dir);

}  // namespace ellm
