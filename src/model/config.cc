#include "model/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/int4_config.h"

namespace ellm {
namespace {

using nlohmann::json;

int64_t get_int(const json& j, const std::string& where, const char* key, bool required,
                int64_t fallback = 0) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) fail(where, std::string("missing field '") + key + "'");
    return fallback;
  }
  if (!it->is_number_integer()) fail(where, std::string("field '") + key + "' must be an integer");
  return it->get<int64_t>();
}

double get_number(const json& j, const std::string& where, const char* key, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) fail(where, std::string("field '") + key + "' must be a number");
  return it->get<double>();
}

bool get_bool(const json& j, const std::string& where, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail(where, std::string("field '") + key + "' must be true or false");
  return it->get<bool>();
}

void require_positive(const std::string& where, const char* key, int64_t v) {
  if (v <= 0) fail(where, std::string("field '") + key + "' must be positive, got " + std::to_string(v));
}

// quantization_config: Qwen's FP8 scheme (E4M3, 128x128 blocks, dynamic activations), or GPTQ and
// AWQ 4-bit (int4_config.cc).
void parse_quantization(const json& j, const std::string& where, ModelConfig& c) {
  auto q = j.find("quantization_config");
  if (q == j.end() || q->is_null()) return;
  if (!q->is_object()) fail(where, "field 'quantization_config' must be an object");
  auto text = [&](const char* key, const char* expected, bool required) {
    auto it = q->find(key);
    if (it == q->end() || it->is_null()) {
      if (required) fail(where, std::string("quantization_config has no '") + key + "'");
      return;
    }
    std::string value = it->is_string() ? it->get<std::string>() : it->dump();
    if (value != expected)
      fail(where, std::string("quantization_config.") + key + " '" + value +
                      "' is not supported (only \"" + expected + "\")");
  };
  auto method = q->find("quant_method");
  if (method == q->end() || method->is_null())
    fail(where, "quantization_config has no 'quant_method'");
  if (*method == "gptq" || *method == "awq") return parse_int4_quantization(*q, where, c);
  if (*method != "fp8")
    fail(where, "quantization_config.quant_method '" +
                    (method->is_string() ? method->get<std::string>() : method->dump()) +
                    "' is not supported (only \"fp8\", \"gptq\" or \"awq\")");
  text("fmt", "e4m3", false);
  text("activation_scheme", "dynamic", false);
  auto block = q->find("weight_block_size");
  if (block != q->end() && !block->is_null() && *block != json::array({128, 128}))
    fail(where, "quantization_config.weight_block_size " + block->dump() +
                    " is not supported (only [128, 128])");
  c.quant_method = "fp8";
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end())
    return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

namespace {

// The fields Qwen3 and Qwen3.5 spell alike, checked.
void parse_shared_fields(const json& j, const std::string& where, ModelConfig& c) {
  c.vocab_size = get_int(j, where, "vocab_size", true);
  c.hidden_size = get_int(j, where, "hidden_size", true);
  c.num_hidden_layers = get_int(j, where, "num_hidden_layers", true);
  c.num_attention_heads = get_int(j, where, "num_attention_heads", true);
  c.num_key_value_heads =
      get_int(j, where, "num_key_value_heads", false, c.num_attention_heads);
  require_positive(where, "hidden_size", c.hidden_size);
  require_positive(where, "num_attention_heads", c.num_attention_heads);
  c.head_dim = get_int(j, where, "head_dim", false, c.hidden_size / c.num_attention_heads);
  c.max_position_embeddings = get_int(j, where, "max_position_embeddings", false, 40960);
  c.rms_norm_eps = get_number(j, where, "rms_norm_eps", 1e-6);
  c.tie_word_embeddings = get_bool(j, where, "tie_word_embeddings", c.tie_word_embeddings);

  require_positive(where, "vocab_size", c.vocab_size);
  require_positive(where, "num_hidden_layers", c.num_hidden_layers);
  require_positive(where, "num_key_value_heads", c.num_key_value_heads);
  require_positive(where, "head_dim", c.head_dim);
  if (c.head_dim % 2) fail(where, "field 'head_dim' must be even for RoPE");
  if (c.num_attention_heads % c.num_key_value_heads)
    fail(where, "num_attention_heads must be a multiple of num_key_value_heads");
  if (c.rms_norm_eps < 0) fail(where, "field 'rms_norm_eps' must not be negative");
  if (get_bool(j, where, "attention_bias", false)) fail(where, "attention_bias is not supported");
  if (get_bool(j, where, "use_sliding_window", false))
    fail(where, "use_sliding_window is not supported");
  auto act = j.find("hidden_act");
  if (act != j.end() && (!act->is_string() || act->get<std::string>() != "silu"))
    fail(where, "field 'hidden_act' must be \"silu\"");
}

void parse_qwen3(const json& j, const std::string& where, ModelConfig& c) {
  auto arch = j.find("architectures");
  if (arch == j.end() || !arch->is_array() || arch->empty() || !(*arch)[0].is_string())
    fail(where, "missing field 'architectures'");
  c.architecture = (*arch)[0].get<std::string>();
  if (c.architecture != "Qwen3ForCausalLM" && c.architecture != "Qwen3MoeForCausalLM")
    fail(where, "unsupported architecture '" + c.architecture +
                    "' (expected Qwen3ForCausalLM or Qwen3MoeForCausalLM)");
  bool moe = c.architecture == "Qwen3MoeForCausalLM";
  if (c.model_type.empty()) c.model_type = moe ? "qwen3_moe" : "qwen3";

  parse_shared_fields(j, where, c);
  c.intermediate_size = get_int(j, where, "intermediate_size", !moe);
  c.rope_theta = get_number(j, where, "rope_theta", 1000000.0);
  if (c.rope_theta <= 0) fail(where, "field 'rope_theta' must be positive");
  auto scaling = j.find("rope_scaling");
  if (scaling != j.end() && !scaling->is_null())
    fail(where, "rope_scaling is not supported");

  if (moe) {
    c.num_experts = get_int(j, where, "num_experts", true);
    c.num_experts_per_tok = get_int(j, where, "num_experts_per_tok", true);
    c.moe_intermediate_size = get_int(j, where, "moe_intermediate_size", true);
    c.norm_topk_prob = get_bool(j, where, "norm_topk_prob", false);
    c.decoder_sparse_step = get_int(j, where, "decoder_sparse_step", false, 1);
    auto only = j.find("mlp_only_layers");
    if (only != j.end() && !only->is_null()) {
      if (!only->is_array()) fail(where, "field 'mlp_only_layers' must be an array of integers");
      for (const json& v : *only) {
        if (!v.is_number_integer())
          fail(where, "field 'mlp_only_layers' must be an array of integers");
        c.mlp_only_layers.push_back(v.get<int64_t>());
      }
    }
    if (c.num_experts < 0) fail(where, "field 'num_experts' must not be negative");
    if (c.num_experts > 0) {
      require_positive(where, "num_experts_per_tok", c.num_experts_per_tok);
      require_positive(where, "moe_intermediate_size", c.moe_intermediate_size);
      if (c.num_experts_per_tok > c.num_experts)
        fail(where, "num_experts_per_tok exceeds num_experts");
    }
    require_positive(where, "decoder_sparse_step", c.decoder_sparse_step);
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (!c.is_moe_layer(i)) require_positive(where, "intermediate_size", c.intermediate_size);
}

// The text config of a Qwen3.5-generation model (QWEN35.md section 2): the layer kinds from
// layer_types or full_attention_interval, RoPE from rope_parameters or rope_theta (+ an mRoPE
// rope_scaling, plain RoPE for text), the Gated DeltaNet shape, the MoE with a shared expert.
void parse_qwen35(const json& j, const std::string& where, ModelConfig& c) {
  const bool moe = c.model_type == "qwen3_5_moe" || c.model_type == "qwen3_5_moe_text";
  parse_shared_fields(j, where, c);

  auto types = j.find("layer_types");
  if (types != j.end() && !types->is_null()) {
    if (!types->is_array()) fail(where, "field 'layer_types' must be an array of strings");
    if (int64_t(types->size()) != c.num_hidden_layers)
      fail(where, "field 'layer_types' lists " + std::to_string(types->size()) +
                      " layers but num_hidden_layers is " + std::to_string(c.num_hidden_layers));
    for (const json& t : *types) {
      std::string kind = t.is_string() ? t.get<std::string>() : t.dump();
      if (kind != "linear_attention" && kind != "full_attention")
        fail(where, "layer type '" + kind + "' is not supported (linear_attention or full_attention)");
      c.linear_attention.push_back(kind == "linear_attention");
    }
  } else {
    int64_t interval = get_int(j, where, "full_attention_interval", false, 4);
    require_positive(where, "full_attention_interval", interval);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      c.linear_attention.push_back((l + 1) % interval != 0);
  }

  double theta = get_number(j, where, "rope_theta", 10000000.0);
  double factor = get_number(j, where, "partial_rotary_factor", 1.0);
  auto rope = j.find("rope_parameters");
  if (rope != j.end() && !rope->is_null()) {
    if (!rope->is_object()) fail(where, "field 'rope_parameters' must be an object");
    theta = get_number(*rope, where, "rope_theta", theta);
    factor = get_number(*rope, where, "partial_rotary_factor", factor);
  }
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_object()) continue;
    auto type = it->find("rope_type");
    if (type == it->end()) type = it->find("type");
    std::string name = type == it->end() || type->is_null() ? "default"
                       : type->is_string()                   ? type->get<std::string>()
                                                             : type->dump();
    if (name != "default" && name != "mrope")  // mRoPE with text positions is plain RoPE
      fail(where, std::string(key) + " type '" + name + "' is not supported");
  }
  c.rope_theta = theta;
  c.partial_rotary_factor = factor;
  if (c.rope_theta <= 0) fail(where, "field 'rope_theta' must be positive");
  if (!(factor > 0 && factor <= 1) || c.rotary_dim() % 2 || c.rotary_dim() == 0)
    fail(where, "partial_rotary_factor " + std::to_string(factor) + " does not give an even " +
                    "number of rotary dims of head_dim " + std::to_string(c.head_dim));
  if (!get_bool(j, where, "attn_output_gate", true))
    fail(where, "attn_output_gate false is not supported");

  c.linear_num_key_heads = get_int(j, where, "linear_num_key_heads", true);
  c.linear_num_value_heads = get_int(j, where, "linear_num_value_heads", true);
  c.linear_key_head_dim = get_int(j, where, "linear_key_head_dim", true);
  c.linear_value_head_dim = get_int(j, where, "linear_value_head_dim", true);
  c.linear_conv_kernel_dim = get_int(j, where, "linear_conv_kernel_dim", false, 4);
  require_positive(where, "linear_num_key_heads", c.linear_num_key_heads);
  require_positive(where, "linear_num_value_heads", c.linear_num_value_heads);
  require_positive(where, "linear_key_head_dim", c.linear_key_head_dim);
  require_positive(where, "linear_value_head_dim", c.linear_value_head_dim);
  if (c.linear_num_value_heads % c.linear_num_key_heads)
    fail(where, "linear_num_value_heads must be a multiple of linear_num_key_heads");
  if (c.linear_value_head_dim > kMaxDeltaHeadDim)
    fail(where, "field 'linear_value_head_dim' must be at most " + std::to_string(kMaxDeltaHeadDim));
  if (c.linear_conv_kernel_dim < 1 || c.linear_conv_kernel_dim > kMaxConvTaps)
    fail(where, "field 'linear_conv_kernel_dim' must be in 1.." + std::to_string(kMaxConvTaps));

  if (moe) {
    c.num_experts = get_int(j, where, "num_experts", true);
    c.num_experts_per_tok = get_int(j, where, "num_experts_per_tok", true);
    c.moe_intermediate_size = get_int(j, where, "moe_intermediate_size", true);
    c.shared_expert_intermediate_size = get_int(j, where, "shared_expert_intermediate_size", false);
    c.norm_topk_prob = true;  // Qwen3.5 always renormalises the top-k
    require_positive(where, "num_experts", c.num_experts);
    require_positive(where, "num_experts_per_tok", c.num_experts_per_tok);
    require_positive(where, "moe_intermediate_size", c.moe_intermediate_size);
    if (c.num_experts_per_tok > c.num_experts) fail(where, "num_experts_per_tok exceeds num_experts");
    if (c.shared_expert_intermediate_size < 0)
      fail(where, "field 'shared_expert_intermediate_size' must not be negative");
  } else {
    c.intermediate_size = get_int(j, where, "intermediate_size", true);
    require_positive(where, "intermediate_size", c.intermediate_size);
  }
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& where) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    fail(where, std::string("invalid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) fail(where, "expected a JSON object");

  ModelConfig c;
  auto type = j.find("model_type");
  if (type != j.end() && !type->is_null())
    c.model_type = type->is_string() ? type->get<std::string>() : type->dump();
  if (c.model_type == "qwen3_5" || c.model_type == "qwen3_5_moe" ||
      c.model_type == "qwen3_5_text" || c.model_type == "qwen3_5_moe_text") {
    auto arch = j.find("architectures");
    if (arch != j.end() && arch->is_array() && !arch->empty() && (*arch)[0].is_string())
      c.architecture = (*arch)[0].get<std::string>();
    c.tie_word_embeddings = get_bool(j, where, "tie_word_embeddings", false);
    const json* text = &j;
    if (c.model_type == "qwen3_5" || c.model_type == "qwen3_5_moe") {  // the VL wrapper
      auto nested = j.find("text_config");
      if (nested == j.end() || !nested->is_object())
        fail(where, "model_type '" + c.model_type + "' needs a 'text_config' object");
      text = &*nested;
    }
    parse_qwen35(*text, where, c);
  } else if (c.model_type.empty() || c.model_type == "qwen3" || c.model_type == "qwen3_moe") {
    parse_qwen3(j, where, c);
  } else {
    fail(where, "unsupported model_type '" + c.model_type +
                    "' (ellm loads qwen3, qwen3_moe, qwen3_5, qwen3_5_moe and qwen3_5_moe_text)");
  }
  parse_quantization(j, where, c);
  return c;
}

ModelConfig load_model_config(const std::string& model_dir) {
  std::string path = model_dir + "/config.json";
  std::ifstream f(path);
  if (!f) fail(path, "cannot open (is this a Hugging Face model folder?)");
  std::stringstream text;
  text << f.rdbuf();
  return parse_model_config(text.str(), path);
}

namespace {

// The vision-language wrapper Qwen ships the Qwen3.5 generation in, with the text model's
// config nested (the vision_config is not written: ellm has no vision tower).
// The quantization_config of an FP8 (Qwen's), GPTQ or AWQ checkpoint; null for BF16.
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
  std::vector<std::string> types;
  for (bool linear : c.linear_attention) types.push_back(linear ? "linear_attention" : "full_attention");
  t["layer_types"] = types;
  t["linear_conv_kernel_dim"] = c.linear_conv_kernel_dim;
  t["linear_key_head_dim"] = c.linear_key_head_dim;
  t["linear_num_key_heads"] = c.linear_num_key_heads;
  t["linear_num_value_heads"] = c.linear_num_value_heads;
  t["linear_value_head_dim"] = c.linear_value_head_dim;
  t["mamba_ssm_dtype"] = "float32";
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
  t["rope_parameters"] = {{"partial_rotary_factor", c.partial_rotary_factor},
                          {"rope_theta", c.rope_theta},
                          {"rope_type", "default"}};
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
