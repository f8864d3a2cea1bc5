#include "model/arch/qwen35.h"

#include "base/error.h"
#include "base/log.h"
#include "model/config_fields.h"
#include "model/rope.h"

namespace ellm {

using nlohmann::json;

namespace {

// The text config of a Qwen3.5-generation model: the layer kinds from layer_types or
// full_attention_interval, RoPE from rope_parameters or rope_theta (multimodal RoPE's sections
// for image tokens; YaRN from either), the Gated DeltaNet shape, the MoE with a shared expert.
void parse_text_config(const json& j, const std::string& where, ModelConfig& c) {
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
    parse_mrope(*rope, where, c);
  }
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (auto it = j.find(key); it != j.end()) parse_rope_type(*it, where, key, c);
  c.rope_theta = theta;
  c.partial_rotary_factor = factor;
  if (c.rope_theta <= 0) fail(where, "field 'rope_theta' must be positive");
  if (!(factor > 0 && factor <= 1) || c.rotary_dim() % 2 || c.rotary_dim() == 0)
    fail(where, "partial_rotary_factor " + std::to_string(factor) + " does not give an even " +
                    "number of rotary dims of head_dim " + std::to_string(c.head_dim));
  check_mrope(where, c);
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

// model_type qwen3_5 and qwen3_5_moe: the vision-language wrapper, its text_config nested;
// qwen3_5_text and qwen3_5_moe_text: flat.
void parse_qwen35_config(const json& j, const std::string& where, ModelConfig& c) {
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
  parse_text_config(*text, where, c);
  c.image_token_id = int32_t(get_int(j, where, "image_token_id", false, -1));
}

Qwen35Weights load_qwen35_weights(const std::string& model_dir, const ModelConfig& c, Isa isa,
                                  bool quantize_fp8, bool quantize_int4, bool mtp,
                                  bool quantize_lm_head) {
  Qwen35Weights m;
  const WeightOptions options{isa, quantize_fp8, quantize_int4, quantize_lm_head, mtp};
  const int64_t H = c.hidden_size;
  const NormReader norm = &TensorLoader::vector_f32_plus_one;  // (1 + w)
  const AttentionSpec attention{H, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                c.rotary_dim(), float(c.rms_norm_eps), /*gated=*/true};
  const GatedDeltaNetSpec deltanet{H, c.linear_num_key_heads, c.linear_num_value_heads,
                                   c.linear_key_head_dim, c.linear_value_head_dim,
                                   c.linear_conv_kernel_dim};
  const MoeSpec moe{H, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size};
  load_decoder_weights(model_dir, c, options, norm, m, [&](TensorLoader& load, const std::string& root) {
    if (mtp && !load.store().find("mtp.fc.weight"))
      fail(model_dir, "the checkpoint has no multi-token-prediction head (no 'mtp.fc.weight'), "
                      "so it cannot draft with mtp");
    // The decoder layers, then the MTP head's (a full-attention layer of the same kind).
    for (int64_t l = 0; l < c.num_hidden_layers + (mtp ? 1 : 0); ++l) {
      const bool is_mtp = l == c.num_hidden_layers;
      const std::string p = is_mtp ? "mtp.layers.0." : root + "layers." + std::to_string(l) + ".";
      Qwen35Layer& L = m.layers.emplace_back();
      L.is_linear = !is_mtp && c.is_linear_layer(l);
      L.input_norm = (load.*norm)(p + "input_layernorm.weight", H);
      if (L.is_linear)
        L.deltanet = load_gated_deltanet(load, p + "linear_attn.", deltanet);
      else
        L.attention = load_attention(load, p + "self_attn.", attention, norm);
      L.post_attention_norm = (load.*norm)(p + "post_attention_layernorm.weight", H);
      L.is_moe = is_mtp ? c.is_moe() : c.is_moe_layer(l);
      if (L.is_moe) {
        L.moe = load_moe(load, p + "mlp.", moe, l, m.expert_bytes);
        L.has_shared_expert = c.shared_expert_intermediate_size > 0;
        if (L.has_shared_expert)
          L.shared_expert = load_shared_expert(load, p + "mlp.", H, c.shared_expert_intermediate_size);
      } else {
        L.mlp = load_swiglu(load, p + "mlp.", H, c.intermediate_size);
      }
    }
    if (mtp) m.mtp = load_mtp(load, H, norm);
  });
  return m;
}

Qwen35Model::Qwen35Model(const std::string& model_dir, const ModelConfig& config,
                         const ServingLimits& limits, std::shared_ptr<ThreadTeam> team)
    : Decoder(config, limits, std::move(team)) {
  const ModelConfig& c = config_;
  // A group of speculative tokens must run the Gated DeltaNet recurrence token by token, as a
  // decode step does, so that its rows equal decode's and the rollback replays the same steps.
  if (limits_.speculative_tokens > kRecurrentRun - 1)
    fail("--num-speculative-tokens", "a hybrid model checks at most 15 proposed tokens at once");
  weights_ = load_qwen35_weights(model_dir, c, active_isa(), limits_.quantize_fp8,
                                 limits_.quantize_int4, limits_.mtp, limits_.int4_lm_head);
  load_tower(model_dir);
  // KV for the full-attention layers (and the MTP head's, last); a recurrent state for the
  // Gated DeltaNet layers.
  int64_t n_full = 0, n_linear = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const bool linear = c.is_linear_layer(l);
    kv_layer_.push_back(linear ? -1 : n_full++);
    state_layer_.push_back(linear ? n_linear++ : -1);
  }
  if (limits_.mtp) {
    kv_layer_.push_back(n_full++);
    state_layer_.push_back(-1);
  }
  attention_spec_ = {c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                     c.rotary_dim(), float(c.rms_norm_eps), /*gated=*/true, bf16_attention()};
  deltanet_spec_ = {c.hidden_size, c.linear_num_key_heads, c.linear_num_value_heads,
                    c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim,
                    float(c.rms_norm_eps)};
  moe_spec_ = {c.hidden_size, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size,
               c.norm_topk_prob};
  if (limits_.mtp)
    mtp_.init({c.hidden_size, c.head_dim / 2, float(c.rms_norm_eps),
               weights_.embedding, &rope_},
              limits_.batch_size, limits_.speculative_tokens + 1);
  const RecurrentShape recurrent{n_linear, c.linear_conv_kernel_dim, c.conv_dim(), c.linear_num_key_heads,
                                 c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim};
  const int64_t widest = std::max({c.hidden_size, c.q_dim(), c.intermediate_size, c.moe_intermediate_size,
                                   c.linear_value_dim(), c.shared_expert_intermediate_size});
  finish_load(model_dir, weights_, {n_full, c.num_key_value_heads, c.head_dim, recurrent}, widest);
  if (limits_.mtp) memory_.attach(&mtp_);
}

void Qwen35Model::plan(ActivationPlan& plan) {
  const ModelConfig& c = config_;
  const size_t T = size_t(max_tokens_);
  plan_attention(plan, attention_, attention_spec_, memory_.kv(), max_tokens_, team_.size());
  plan_gated_deltanet(plan, deltanet_, deltanet_spec_, T, team_.size());
  plan_swiglu(plan, mlp_, T, size_t(std::max<int64_t>(c.intermediate_size, 0)));
  plan_moe(plan, moe_, moe_spec_, T);
  plan_shared_expert(plan, shared_, T, size_t(c.hidden_size), size_t(c.shared_expert_intermediate_size));
  if (limits_.mtp) mtp_.plan(plan, T);
}

// One decoder layer over the rows:
//   x = x + mixer(input_layernorm(x))        Gated DeltaNet, or gated attention
//   x = x + ffn(post_attention_layernorm(x))  SwiGLU, or MoE + shared expert
void Qwen35Model::layer(int64_t l, const PassRows& rows) {
  const Qwen35Layer& L = weights_.layers[l];
  const int64_t n = rows.size(), H = config_.hidden_size;
  const float eps = float(config_.rms_norm_eps);
  rms_norm_to_bf16(ctx_, L.input_norm.get(), eps, rows.x, n, H, normed_);
  if (L.is_linear)
    gated_deltanet(ctx_, deltanet_spec_, L.deltanet, memory_, state_layer_[l], rows, normed_.xb, deltanet_);
  else
    self_attention(ctx_, attention_spec_, L.attention, memory_.kv(), kv_layer_[l], rows, normed_.xb, attention_);
  rms_norm_to_bf16(ctx_, L.post_attention_norm.get(), eps, rows.x, n, H, normed_);
  if (L.is_moe) {
    moe(ctx_, moe_spec_, L.moe, normed_, n, moe_, rows.x);
    if (L.has_shared_expert) shared_expert(ctx_, L.shared_expert, normed_, n, H, shared_, rows.x);
  } else {
    swiglu(ctx_, L.mlp, normed_.xb, n, H, mlp_, rows.x, /*accumulate=*/true);
  }
}

// After a pass, the MTP head's KV for the pairs the pass completed.
void Qwen35Model::after_pass(const PassRows& rows) {
  if (!limits_.mtp) return;
  const int64_t pairs = mtp_.after_pass(ctx_, weights_.mtp, weights_.final_norm.get(), rows, normed_.xn);
  if (pairs > 0) mtp_layer(pairs, rows.x, rows.rope_cos, rows.rope_sin);  // the pass is done with x
}

void Qwen35Model::mtp_layer(int64_t n, float* x, float* rope_cos, float* rope_sin) {
  const int64_t H = config_.hidden_size;
  ctx_.gemm(Op::mtp_fc, mtp_.inputs(), n, 2 * H, weights_.mtp.fc, x, H, false);
  layer(config_.num_hidden_layers, {mtp_.tokens(n), x, rope_cos, rope_sin});
}

void Qwen35Model::mtp_forward(std::span<const BatchToken> tokens, float* logits) {
  if (!limits_.mtp) fail_no_mtp();
  if (pass_open()) fail("mtp_forward", "a pass is in progress");
  validate(tokens);
  const int64_t n = int64_t(tokens.size()), H = config_.hidden_size, V = config_.vocab_size;
  if (n > limits_.batch_size)
    fail("mtp_forward", std::to_string(n) + " tokens, more than the batch size " +
                            std::to_string(limits_.batch_size));
  mtp_.draft_inputs(ctx_, weights_.mtp, tokens, step_rope_cos_, step_rope_sin_);
  for (const BatchToken& t : tokens) {
    memory_.kv().note_written(t.slot, t.position);
    memory_.kv().commit(t.slot, t.position, team_);
  }
  mtp_layer(n, step_x_, step_rope_cos_, step_rope_sin_);
  // The head's output, normed: the next draft's hidden state and the lm_head's input.
  mtp_.draft_outputs(weights_.mtp, tokens, step_x_, normed_.xb);
  ctx_.gemm(Op::lm_head, normed_.xb, n, H, weights_.lm_head, logits, V, false);
}

void Qwen35Model::for_each_matrix(const MatrixFn& fn) {
  auto swiglu_matrices = [&](SwiGluWeights& s) {
    fn(s.gate_up);
    fn(s.down);
  };
  for (Qwen35Layer& L : weights_.layers) {
    for (PackedWeights* w : {&L.attention.qkv, &L.attention.o_proj, &L.deltanet.qkvz,
                             &L.deltanet.ba, &L.deltanet.out_proj})
      fn(*w);
    swiglu_matrices(L.mlp);
    for (SwiGluWeights& e : L.moe.experts) swiglu_matrices(e);
    swiglu_matrices(L.shared_expert.mlp);
  }
  fn(weights_.mtp.fc);
  fn(weights_.lm_head);
}

void Qwen35Model::describe(std::string& line) const {
  const int64_t n_linear = std::count_if(state_layer_.begin(), state_layer_.end(), [](int64_t i) { return i >= 0; });
  const int64_t n_full = std::count_if(kv_layer_.begin(), kv_layer_.end(), [](int64_t i) { return i >= 0; });
  line += ", recurrent state " + format_bytes(double(state_bytes_per_slot())) + " per slot (" +
          std::to_string(n_linear) + " Gated DeltaNet layers, KV in " + std::to_string(n_full) + ")";
  if (!memory_.rollback().empty())
    line += ", " + format_bytes(double(memory_.rollback().bytes())) + " to roll speculative tokens back";
  if (limits_.mtp) line += ", MTP head loaded";
  describe_tower(line);
}


// Bump the version whenever the KV rows' meaning changes (dtype, RoPE, row layout). The KV of
// the full-attention layers only, RoPE on the rotary dims; snapshots of the state
// (state_ranges): per Gated DeltaNet layer the conv window, then S, FP32.
std::string Qwen35Model::kv_format() const {
  const ModelConfig& c = config_;
  return "qwen35-kv v1 " + std::string(kv_format_tag(memory_.kv().dtype())) + " layers=" + std::to_string(c.num_hidden_layers) +
         " state=f32 conv[" + std::to_string(c.linear_conv_kernel_dim - 1) + "][" +
         std::to_string(c.conv_dim()) + "] S[" + std::to_string(c.linear_num_value_heads) + "][" +
         std::to_string(c.linear_key_head_dim) + "][" + std::to_string(c.linear_value_head_dim) + "]" +
         " full=" + std::to_string(memory_.kv().bytes_per_token() / (2 * memory_.kv().row_bytes())) +
         " kv_heads=" + std::to_string(c.num_key_value_heads) +
         " head_dim=" + std::to_string(c.head_dim) +
         " rotary=" + std::to_string(c.rotary_dim()) +
         " " + rope_format(c) + bf16_attention_tag();
}

}  // namespace ellm
