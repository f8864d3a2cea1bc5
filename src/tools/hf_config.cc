#include "tools/hf_config.h"

#include <nlohmann/json.hpp>

namespace ellm {

namespace {

// The quantization_config of an FP8 (Qwen's), GPTQ or AWQ checkpoint; null for BF16.
// The Qwen3.5 generation's rope_parameters, with multimodal RoPE's sections as Qwen's configs
// give them ([11, 11, 10] for 32 frequencies): an image's tokens turn by their (T, H, W)
// positions, text by its own position on all three.
nlohmann::ordered_json rope_parameters_json(const ModelConfig& c) {
  const int64_t half = c.rotary_dim() / 2, section = (half + 2) / 3;
  return {{"mrope_interleaved", true},
          {"mrope_section", {section, section, half - 2 * section}},
          {"partial_rotary_factor", c.partial_rotary_factor},
          {"rope_theta", c.rope_theta},
          {"rope_type", "default"}};
}

nlohmann::ordered_json quantization_config_json(const ModelConfig& c) {
  if (c.quant_method == "fp8")
    return {{"quant_method", "fp8"},
            {"fmt", "e4m3"},
            {"activation_scheme", "dynamic"},
            {"weight_block_size", {128, 128}}};
  if (c.quant_method == "gptq")
    return {{"quant_method", "gptq"}, {"checkpoint_format", c.int4.format},
            {"bits", 4},           {"group_size", c.int4.group_size},
            {"desc_act", false},   {"sym", true},
            {"lm_head", false}};
  if (c.quant_method == "awq")
    return {{"quant_method", "awq"}, {"version", "gemm"},
            {"zero_point", true},  {"group_size", c.int4.group_size},
            {"bits", 4},           {"modules_to_not_convert", nullptr}};
  return nullptr;
}

// The hybrid stack's layer_types and Gated DeltaNet fields.
void add_hybrid_layer_fields(nlohmann::ordered_json& t, const ModelConfig& c) {
  std::vector<std::string> types;
  for (bool linear : c.linear_attention) types.push_back(linear ? "linear_attention" : "full_attention");
  t["layer_types"] = types;
  t["linear_conv_kernel_dim"] = c.linear_conv_kernel_dim;
  t["linear_key_head_dim"] = c.linear_key_head_dim;
  t["linear_num_key_heads"] = c.linear_num_key_heads;
  t["linear_num_value_heads"] = c.linear_num_value_heads;
  t["linear_value_head_dim"] = c.linear_value_head_dim;
  t["mamba_ssm_dtype"] = "float32";
}

// The vision-language wrapper Qwen ships the Qwen3.5 generation in, with the text model's
// config nested (make-model adds the vision_config where it writes a tower: vision_checkpoint.h).
std::string qwen35_config_json(const ModelConfig& c, int32_t bos_token_id, int32_t eos_token_id) {
  const bool moe = c.is_moe();
  nlohmann::ordered_json t;
  t["attention_bias"] = false;
  t["attn_output_gate"] = true;
  if (bos_token_id >= 0) t["bos_token_id"] = bos_token_id;
  if (eos_token_id >= 0) t["eos_token_id"] = eos_token_id;
  t["head_dim"] = c.head_dim;
  t["hidden_act"] = "silu";
  t["hidden_size"] = c.hidden_size;
  if (!moe) t["intermediate_size"] = c.intermediate_size;
  add_hybrid_layer_fields(t, c);
  t["max_position_embeddings"] = c.max_position_embeddings;
  t["model_type"] = moe ? "qwen3_5_moe_text" : "qwen3_5_text";
  if (moe) {
    t["moe_intermediate_size"] = c.moe_intermediate_size;
    t["num_experts"] = c.num_experts;
    t["num_experts_per_tok"] = c.num_experts_per_tok;
  }
  t["num_attention_heads"] = c.num_attention_heads;
  t["num_hidden_layers"] = c.num_hidden_layers;
  t["num_key_value_heads"] = c.num_key_value_heads;
  t["partial_rotary_factor"] = c.partial_rotary_factor;
  t["rms_norm_eps"] = c.rms_norm_eps;
  t["rope_parameters"] = rope_parameters_json(c);
  if (moe) t["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  t["tie_word_embeddings"] = c.tie_word_embeddings;
  t["vocab_size"] = c.vocab_size;

  nlohmann::ordered_json j;
  j["architectures"] = {moe ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5ForConditionalGeneration"};
  j["model_type"] = moe ? "qwen3_5_moe" : "qwen3_5";
  if (!c.quant_method.empty()) j["quantization_config"] = quantization_config_json(c);
  j["text_config"] = t;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["transformers_version"] = "4.57.1";
  return j.dump(2) + "\n";
}

}  // namespace

std::string qwen4exp_config_json(const ModelConfig& c, const Qwen4ExpConfig& x) {
  nlohmann::ordered_json t;
  t["attention_bias"] = false;
  t["bos_token_id"] = x.eos;
  t["eos_token_id"] = x.eos;
  t["full_attention_interval"] = 4;
  t["hc_count"] = x.hc_count;
  t["hc_lowrank"] = x.hc_lowrank;
  t["head_dim"] = c.head_dim;
  t["heads_per_ngram"] = x.heads_per_ngram;
  t["hidden_act"] = "silu";
  t["hidden_size"] = c.hidden_size;
  t["indexer_budget"] = x.indexer_budget;
  t["indexer_compress_ratio"] = x.indexer_ratio;
  t["indexer_head_dim"] = x.indexer_head_dim;
  t["indexer_kv_heads"] = 1;
  t["indexer_n_heads"] = x.indexer_heads;
  add_hybrid_layer_fields(t, c);
  t["make_ngram_vocab_size_divisible_by"] = x.ngram_vocab_divisor;
  t["max_position_embeddings"] = c.max_position_embeddings;
  t["model_type"] = "qwen4_exp_text";
  t["moe_intermediate_size"] = c.moe_intermediate_size;
  t["ngram_size"] = x.ngram_size;
  t["ngram_vocab_size_base"] = x.ngram_vocab_size_base;
  t["norm_topk_prob"] = c.norm_topk_prob;
  t["num_attention_heads"] = c.num_attention_heads;
  t["num_experts"] = c.num_experts;
  t["num_experts_per_tok"] = c.num_experts_per_tok;
  t["num_hidden_layers"] = c.num_hidden_layers;
  t["num_key_value_heads"] = c.num_key_value_heads;
  t["output_gate_type"] = x.sigmoid_gate ? "sigmoid" : "silu";
  t["partial_rotary_factor"] = c.partial_rotary_factor;
  t["ple_conv_kernel_size"] = x.ple_conv_kernel_size;
  t["ple_embed_dim"] = x.ple_embed_dim;
  std::vector<int64_t> ple_ids;  // counted from 1
  for (int64_t l : x.ple_layers) ple_ids.push_back(l + 1);
  t["ple_layer_ids"] = ple_ids;
  t["rms_norm_eps"] = c.rms_norm_eps;
  t["rope_parameters"] = rope_parameters_json(c);
  t["seed"] = x.seed;
  t["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  t["split_ngram_parts"] = x.split_ngram_parts;
  t["tie_word_embeddings"] = c.tie_word_embeddings;
  t["vocab_size"] = c.vocab_size;

  nlohmann::ordered_json j;
  j["architectures"] = {"Qwen4ExpForConditionalGeneration"};
  j["model_type"] = "qwen4_exp";
  if (!c.quant_method.empty()) j["quantization_config"] = quantization_config_json(c);
  j["text_config"] = t;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["transformers_version"] = "5.9.0";
  return j.dump(2) + "\n";
}

std::string model_config_json(const ModelConfig& c, int32_t bos_token_id, int32_t eos_token_id) {
  if (c.is_hybrid()) return qwen35_config_json(c, bos_token_id, eos_token_id);
  bool moe = c.architecture == "Qwen3MoeForCausalLM";
  nlohmann::ordered_json j;
  j["architectures"] = {c.architecture};
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (moe) j["decoder_sparse_step"] = c.decoder_sparse_step;
  if (eos_token_id >= 0) j["eos_token_id"] = eos_token_id;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = c.intermediate_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["max_window_layers"] = c.num_hidden_layers;
  if (moe) {
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["model_type"] = "qwen3_moe";
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
  } else {
    j["model_type"] = "qwen3";
  }
  j["num_attention_heads"] = c.num_attention_heads;
  if (moe) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
  }
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_scaling"] = nullptr;
  j["rope_theta"] = c.rope_theta;
  j["sliding_window"] = nullptr;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = "bfloat16";
  j["transformers_version"] = "4.51.0";
  j["use_cache"] = true;
  j["use_sliding_window"] = false;
  j["vocab_size"] = c.vocab_size;
  if (!c.quant_method.empty()) j["quantization_config"] = quantization_config_json(c);
  return j.dump(2) + "\n";
}

}  // namespace ellm
