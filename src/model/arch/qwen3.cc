#include "model/arch/qwen3.h"

#include "base/error.h"
#include "model/config_fields.h"
#include "model/rope.h"

namespace ellm {

using nlohmann::json;

void parse_qwen3_config(const json& j, const std::string& where, ModelConfig& c) {
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
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it == j.end()) continue;
    if (it->is_object()) c.rope_theta = get_number(*it, where, "rope_theta", c.rope_theta);
    parse_rope_type(*it, where, key, c);
  }

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

Qwen3Weights load_qwen3_weights(const std::string& model_dir, const ModelConfig& c, Isa isa,
                                bool quantize_fp8, bool quantize_int4, bool quantize_lm_head) {
  Qwen3Weights m;
  const WeightOptions options{isa, quantize_fp8, quantize_int4, quantize_lm_head};
  const AttentionSpec attention{c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim};
  const MoeSpec moe{c.hidden_size, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size};
  load_decoder_weights(model_dir, c, options, &TensorLoader::vector_f32, m,
                       [&](TensorLoader& load, const std::string& root) {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = root + "layers." + std::to_string(l) + ".";
      Qwen3Layer& L = m.layers.emplace_back();
      L.input_norm = load.vector_f32(p + "input_layernorm.weight", c.hidden_size);
      L.attention = load_attention(load, p + "self_attn.", attention, &TensorLoader::vector_f32);
      L.post_attention_norm = load.vector_f32(p + "post_attention_layernorm.weight", c.hidden_size);
      L.is_moe = c.is_moe_layer(l);
      if (L.is_moe)
        L.moe = load_moe(load, p + "mlp.", moe, l, m.expert_bytes);
      else
        L.mlp = load_swiglu(load, p + "mlp.", c.hidden_size, c.intermediate_size);
    }
  });
  return m;
}

Qwen3Model::Qwen3Model(const std::string& model_dir, const ModelConfig& config,
                       const ServingLimits& limits, std::shared_ptr<ThreadTeam> team)
    : Decoder(config, limits, std::move(team)) {
  const ModelConfig& c = config_;
  if (limits_.mtp)
    fail("--speculative mtp", "only the hybrid Qwen3.5+ models have a multi-token-prediction head; " +
                                  c.model_type + " has none");
  weights_ = load_qwen3_weights(model_dir, c, active_isa(), limits_.quantize_fp8,
                                limits_.quantize_int4, limits_.int4_lm_head);
  attention_spec_ = {c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                     c.head_dim, float(c.rms_norm_eps), /*gated=*/false,
                     bf16_attention()};
  moe_spec_ = {c.hidden_size, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size,
               c.norm_topk_prob};
  const int64_t widest = std::max({c.hidden_size, c.q_dim(), c.intermediate_size, c.moe_intermediate_size});
  finish_load(model_dir, weights_, {c.num_hidden_layers, c.num_key_value_heads, c.head_dim}, widest);
}

void Qwen3Model::plan(ActivationPlan& plan) {
  const ModelConfig& c = config_;
  const size_t T = size_t(max_tokens_);
  plan_attention(plan, attention_, attention_spec_, memory_.kv(), max_tokens_, team_.size());
  plan_swiglu(plan, mlp_, T, size_t(std::max<int64_t>(c.intermediate_size, 0)));
  plan_moe(plan, moe_, moe_spec_, T);
}

// One decoder layer over the rows:
//   x = x + attention(input_layernorm(x))
//   x = x + mlp(post_attention_layernorm(x))        (MoE layers: the sparse MoE block)
void Qwen3Model::layer(int64_t l, const PassRows& rows) {
  const Qwen3Layer& L = weights_.layers[l];
  const int64_t n = rows.size(), H = config_.hidden_size;
  const float eps = float(config_.rms_norm_eps);
  rms_norm_to_bf16(ctx_, L.input_norm.get(), eps, rows.x, n, H, normed_);
  self_attention(ctx_, attention_spec_, L.attention, memory_.kv(), l, rows, normed_.xb, attention_);
  rms_norm_to_bf16(ctx_, L.post_attention_norm.get(), eps, rows.x, n, H, normed_);
  if (L.is_moe)
    moe(ctx_, moe_spec_, L.moe, normed_, n, moe_, rows.x);
  else
    swiglu(ctx_, L.mlp, normed_.xb, n, H, mlp_, rows.x, /*accumulate=*/true);
}

void Qwen3Model::for_each_matrix(const MatrixFn& fn) {
  for (Qwen3Layer& L : weights_.layers) {
    fn(L.attention.qkv);
    fn(L.attention.o_proj);
    fn(L.mlp.gate_up);
    fn(L.mlp.down);
    for (SwiGluWeights& e : L.moe.experts) {
      fn(e.gate_up);
      fn(e.down);
    }
  }
  fn(weights_.lm_head);
}

// Bump the version whenever the KV rows' meaning changes (dtype, RoPE, row layout).
std::string Qwen3Model::kv_format() const {
  return "qwen3-kv v1 " + std::string(kv_format_tag(memory_.kv().dtype())) + " layers=" + std::to_string(config_.num_hidden_layers) +
         " kv_heads=" + std::to_string(config_.num_key_value_heads) +
         " head_dim=" + std::to_string(config_.head_dim) + " " + rope_format(config_) + bf16_attention_tag();
}

}  // namespace ellm
