#include "model/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/config_fields.h"
#include "model/load/int4_config.h"
#include "model/registry.h"

namespace ellm {

using nlohmann::json;

int64_t get_int(const json& j, const std::string& where, const char* key, bool required,
                int64_t fallback) {
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

namespace {

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
  const Architecture* architecture = find_architecture(c.model_type);
  if (!architecture)
    fail(where, "unsupported model_type '" + c.model_type + "' (ellm loads " + supported_model_types() + ")");
  architecture->parse(j, where, c);
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

}  // namespace ellm
