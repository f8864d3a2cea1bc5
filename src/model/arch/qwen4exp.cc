#include "model/arch/qwen4exp.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/log.h"
#include "model/config_fields.h"
#include "model/rope.h"

namespace ellm {

using nlohmann::json;

namespace {

// The text config: the wrapper (qwen4_exp, qwen3_8_flash_next) nests it in text_config.
const json& text_config(const json& j, const std::string& where, const std::string& model_type) {
  if (model_type == "qwen4_exp_text") return j;
  auto nested = j.find("text_config");
  if (nested == j.end() || !nested->is_object())
    fail(where, "model_type '" + model_type + "' needs a 'text_config' object");
  return *nested;
}

int64_t positive(const json& j, const std::string& where, const char* key, bool required, int64_t fallback = 0) {
  const int64_t v = get_int(j, where, key, required, fallback);
  require_positive(where, key, v);
  return v;
}

std::string text_field(const json& j, const char* key, const std::string& fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->is_string() ? it->get<std::string>() : it->dump();
}

}  // namespace

Qwen4ExpConfig parse_qwen4exp_fields(const json& root, const std::string& where, ModelConfig& c) {
  auto arch = root.find("architectures");
  if (arch != root.end() && arch->is_array() && !arch->empty() && (*arch)[0].is_string())
    c.architecture = (*arch)[0].get<std::string>();
  c.tie_word_embeddings = get_bool(root, where, "tie_word_embeddings", false);
  const json& j = text_config(root, where, c.model_type);
  parse_shared_fields(j, where, c);
  Qwen4ExpConfig x;

  // Layers: layer_types is required, one per layer.
  auto types = j.find("layer_types");
  if (types == j.end() || !types->is_array()) fail(where, "field 'layer_types' must be an array of strings");
  if (int64_t(types->size()) != c.num_hidden_layers)
    fail(where, "field 'layer_types' lists " + std::to_string(types->size()) +
                    " layers but num_hidden_layers is " + std::to_string(c.num_hidden_layers));
  for (const json& t : *types) {
    const std::string kind = t.is_string() ? t.get<std::string>() : t.dump();
    if (kind != "linear_attention" && kind != "full_attention")
      fail(where, "layer type '" + kind + "' is not supported (linear_attention or full_attention)");
    c.linear_attention.push_back(kind == "linear_attention");
  }

  // RoPE: rope_parameters (multimodal RoPE's sections for image tokens, whose text positions
  // give plain RoPE on the rotary dims; YaRN).
  c.rope_theta = get_number(j, where, "rope_theta", 10000000.0);
  c.partial_rotary_factor = get_number(j, where, "partial_rotary_factor", 0.25);
  if (auto rope = j.find("rope_parameters"); rope != j.end() && rope->is_object()) {
    c.rope_theta = get_number(*rope, where, "rope_theta", c.rope_theta);
    c.partial_rotary_factor = get_number(*rope, where, "partial_rotary_factor", c.partial_rotary_factor);
    parse_rope_type(*rope, where, "rope_parameters", c);
    parse_mrope(*rope, where, c);
  }
  if (c.rope_theta <= 0) fail(where, "field 'rope_theta' must be positive");
  const int64_t rd = c.rotary_dim();
  if (rd <= 0 || rd % 2 || rd > c.head_dim || rd > 512)
    fail(where, "partial_rotary_factor " + std::to_string(c.partial_rotary_factor) +
                    " does not give an even number of rotary dims (at most 512) of head_dim " +
                    std::to_string(c.head_dim));

  check_mrope(where, c);
  c.image_token_id = int32_t(get_int(root, where, "image_token_id", false, -1));

  // Gated DeltaNet.
  c.linear_num_key_heads = positive(j, where, "linear_num_key_heads", true);
  c.linear_num_value_heads = positive(j, where, "linear_num_value_heads", true);
  c.linear_key_head_dim = positive(j, where, "linear_key_head_dim", true);
  c.linear_value_head_dim = positive(j, where, "linear_value_head_dim", true);
  c.linear_conv_kernel_dim = positive(j, where, "linear_conv_kernel_dim", false, 4);
  if (c.linear_num_value_heads % c.linear_num_key_heads)
    fail(where, "linear_num_value_heads must be a multiple of linear_num_key_heads");
  if (c.linear_value_head_dim > kMaxDeltaHeadDim || c.linear_conv_kernel_dim > kMaxConvTaps)
    fail(where, "linear_value_head_dim or linear_conv_kernel_dim is too large");
  const std::string gate = text_field(j, "output_gate_type", "sigmoid");
  if (gate != "sigmoid" && gate != "silu")
    fail(where, "output_gate_type '" + gate + "' is not supported (sigmoid or silu)");
  x.sigmoid_gate = gate == "sigmoid";

  // MoE in every layer, with a shared expert.
  c.num_experts = positive(j, where, "num_experts", true);
  c.num_experts_per_tok = positive(j, where, "num_experts_per_tok", true);
  c.moe_intermediate_size = positive(j, where, "moe_intermediate_size", true);
  c.shared_expert_intermediate_size = positive(j, where, "shared_expert_intermediate_size", true);
  c.norm_topk_prob = get_bool(j, where, "norm_topk_prob", true);
  if (c.num_experts_per_tok > c.num_experts) fail(where, "num_experts_per_tok exceeds num_experts");

  // Hyper-connections.
  x.hc_count = positive(j, where, "hc_count", true);
  x.hc_lowrank = positive(j, where, "hc_lowrank", true);

  // QSA's indexer.
  x.indexer_heads = positive(j, where, "indexer_n_heads", true);
  if (x.indexer_heads > kMaxIndexHeads)
    fail(where, "indexer_n_heads " + std::to_string(x.indexer_heads) + " is more than the " +
                    std::to_string(kMaxIndexHeads) + " ellm supports");
  x.indexer_head_dim = positive(j, where, "indexer_head_dim", true);
  x.indexer_budget = positive(j, where, "indexer_budget", true);
  x.indexer_ratio = positive(j, where, "indexer_compress_ratio", true);
  if (get_int(j, where, "indexer_kv_heads", false, 1) != 1) fail(where, "indexer_kv_heads must be 1");
  if (x.indexer_budget % x.indexer_ratio)
    fail(where, "indexer_budget must be a multiple of indexer_compress_ratio");
  if (x.indexer_head_dim < rd) fail(where, "indexer_head_dim is smaller than the rotary dims");

  // The n-gram embedding.
  if (auto ids = j.find("ple_layer_ids"); ids != j.end() && !ids->is_null()) {
    if (!ids->is_array()) fail(where, "field 'ple_layer_ids' must be an array of layer numbers");
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 1 || id.get<int64_t>() > c.num_hidden_layers)
        fail(where, "ple_layer_ids holds " + id.dump() + ", not a layer number in 1.." +
                        std::to_string(c.num_hidden_layers) + " (they count from 1)");
      x.ple_layers.push_back(id.get<int64_t>() - 1);
    }
  }
  if (!x.ple_layers.empty()) {
    x.ple_embed_dim = positive(j, where, "ple_embed_dim", true);
    x.ngram_size = positive(j, where, "ngram_size", true);
    x.heads_per_ngram = positive(j, where, "heads_per_ngram", true);
    x.ngram_vocab_size_base = positive(j, where, "ngram_vocab_size_base", true);
    x.ngram_vocab_divisor = positive(j, where, "make_ngram_vocab_size_divisible_by", false, 1);
    x.split_ngram_parts = positive(j, where, "split_ngram_parts", true);
    x.seed = get_int(j, where, "seed", false, 0);
    x.ple_conv_kernel_size = positive(j, where, "ple_conv_kernel_size", false, 4);
    if (x.ple_conv_kernel_size < 2) fail(where, "field 'ple_conv_kernel_size' must be at least 2");
    if (x.ngram_size < 2 || x.ngram_size > 8) fail(where, "field 'ngram_size' must be in 2..8");
    if (x.ple_embed_dim % ((x.ngram_size - 1) * x.heads_per_ngram))
      fail(where, "ple_embed_dim must be a multiple of (ngram_size - 1) x heads_per_ngram");
  }
  const json* eos = j.contains("eos_token_id") ? &j["eos_token_id"] : root.contains("eos_token_id") ? &root["eos_token_id"] : nullptr;
  if (eos && eos->is_array() && !eos->empty()) eos = &(*eos)[0];
  if (!eos || !eos->is_number_integer())
    fail(where, "field 'eos_token_id' must be a token id (the n-gram hash resets at it)");
  x.eos = eos->get<int32_t>();
  return x;
}

void parse_qwen4exp_config(const json& j, const std::string& where, ModelConfig& c) {
  parse_qwen4exp_fields(j, where, c);
}

Qwen4ExpModel::Qwen4ExpModel(const std::string& model_dir, const ModelConfig& config,
                             const Qwen4ExpConfig& extra, const ServingLimits& limits,
                             std::shared_ptr<ThreadTeam> team)
    : Decoder(config, limits, std::move(team)), extra_(extra) {
  const ModelConfig& c = config_;
  const Qwen4ExpConfig& x = extra_;
  // A group of speculative tokens runs the Gated DeltaNet recurrence token by token, as decode
  // does, so that a rollback replays the same steps.
  if (limits_.speculative_tokens > kRecurrentRun - 1)
    fail("--num-speculative-tokens", "a hybrid model checks at most 15 proposed tokens at once");
  if (limits_.mtp) fail("--mtp", "Qwen3.8-Flash-Next's multi-token-prediction head is not supported");
  const int64_t H = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  streams_ = x.hc_count;
  hc_spec_ = {H, x.hc_count, x.hc_lowrank, eps};
  qsa_spec_ = {{H, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rotary_dim(), eps, /*gated=*/true},
               x.indexer_heads, x.indexer_head_dim, x.indexer_budget, x.indexer_ratio};
  deltanet_spec_ = {H, c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                    c.linear_value_head_dim, c.linear_conv_kernel_dim, eps, x.sigmoid_gate};
  moe_spec_ = {H, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.norm_topk_prob};
  ple_spec_ = {H, x.hc_count, x.ple_embed_dim, x.ngram_size, x.heads_per_ngram, x.ple_conv_kernel_size,
               c.vocab_size, x.ngram_vocab_size_base, x.ngram_vocab_divisor, x.seed, 0, x.eos, eps};

  int64_t n_full = 0, n_linear = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const bool linear = c.is_linear_layer(l);
    kv_layer_.push_back(linear ? -1 : n_full++);
    state_layer_.push_back(linear ? n_linear++ : -1);
    const auto ple = std::find(x.ple_layers.begin(), x.ple_layers.end(), l);
    ple_index_.push_back(ple == x.ple_layers.end() ? -1 : ple - x.ple_layers.begin());
  }

  WeightOptions options{active_isa(), limits_.quantize_fp8, limits_.quantize_int4,
                        limits_.int4_lm_head, /*mtp=*/false, /*final_norm=*/false};
  for (int64_t l : x.ple_layers)  // the n-gram tables stay mapped
    options.left_mapped.push_back("layers." + std::to_string(l) + ".ple.ple_embedding.ngram_embedding.");
  Qwen4ExpWeights& m = weights_;
  load_decoder_weights(model_dir, c, options, &TensorLoader::vector_f32_plus_one, m,
                       [&](TensorLoader& load, const std::string& root) {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = root + "layers." + std::to_string(l) + ".";
      Qwen4ExpLayer& L = m.layers.emplace_back();
      if (ple_index_[l] >= 0) {
        NgramEmbeddingSpec spec = ple_spec_;
        spec.module_index = ple_index_[l];
        m.ple.push_back(load_ngram_embedding(load, p + "ple.", spec, x.split_ngram_parts));
        if (limits_.lock_mapped_table) m.ple.back()->table.lock();
        L.ple = m.ple.back().get();
      }
      L.attn_hc = load_hyper_connection(load, p + "attn_hyper_connection.", hc_spec_, true);
      L.is_linear = c.is_linear_layer(l);
      if (L.is_linear)
        L.deltanet = load_gated_deltanet(load, p + "linear_attn.", deltanet_spec_);
      else
        L.attention = load_sparse_attention(load, p + "self_attn.", qsa_spec_);
      L.mlp_hc = load_hyper_connection(load, p + "mlp_hyper_connection.", hc_spec_, true);
      L.moe = load_moe(load, p + "mlp.", moe_spec_, l, m.expert_bytes);
      L.shared_expert = load_shared_expert(load, p + "mlp.", H, c.shared_expert_intermediate_size);
    }
    m.mixer = load_hyper_connection(load, root + "hyper_connection_mixer.", hc_spec_, false);
  });
  load_tower(model_dir);

  // KV (with the indexer's keys) for the QSA layers; per slot the Gated DeltaNet states, then
  // each n-gram module's history and hash context.
  const RecurrentShape recurrent{n_linear, c.linear_conv_kernel_dim, c.conv_dim(), c.linear_num_key_heads,
                                 c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim,
                                 int64_t(x.ple_layers.size()), ple_spec_.history_rows(), ple_spec_.row_floats()};
  const int64_t widest = std::max({H, c.q_dim(), c.moe_intermediate_size, c.linear_value_dim(),
                                   c.shared_expert_intermediate_size});
  finish_load(model_dir, weights_, {n_full, c.num_key_value_heads, c.head_dim, recurrent, qsa_spec_.cache_floats()},
              widest);
}

void Qwen4ExpModel::plan(ActivationPlan& plan) {
  const ModelConfig& c = config_;
  const size_t T = size_t(max_tokens_), H = size_t(c.hidden_size);
  plan_hyper_weights(plan, hc_, hc_spec_, T);
  plan.carve(block_out_, T * H);
  // One block runs at a time, so the mixes, the two mixers, the MoE and the n-gram module share
  // their scratch: a 32k-token pass of the 4-layer cut takes about 7 GiB of activations in all,
  // where it took about 27. The final mix reads final_x_, so the two are carved one after the
  // other.
  plan.overlay(
      [&](ActivationPlan& p) {
        plan_hyper_mix(p, hc_, hc_spec_, T);
        p.carve(final_x_, T * size_t(residual_width()));
      },
      [&](ActivationPlan& p) {
        plan_sparse_attention(p, qsa_, qsa_spec_, memory_.kv(), max_tokens_, limits_.sequence_length, team_.size());
      },
      [&](ActivationPlan& p) { plan_gated_deltanet(p, deltanet_, deltanet_spec_, T, team_.size()); },
      [&](ActivationPlan& p) {
        plan_moe(p, moe_, moe_spec_, T);
        plan_shared_expert(p, shared_, T, H, size_t(c.shared_expert_intermediate_size));
      },
      [&](ActivationPlan& p) {
        if (!extra_.ple_layers.empty()) plan_ngram_embedding(p, ple_, ple_spec_, T, size_t(limits_.batch_size));
      });
  // The small matrices' scratch: the widest is a mix's [width] rows; the most elements, the
  // n-gram key projection's or a mix's.
  const int64_t W = residual_width(), R = extra_.hc_lowrank;
  size_t most = size_t(W) * size_t(R);
  int64_t widest = W;
  if (!extra_.ple_layers.empty()) {
    most = std::max(most, size_t(W) * size_t(ple_spec_.embed_dim));
    widest = std::max(widest, ple_spec_.embed_dim);
  }
  most = std::max(most, size_t(qsa_spec_.index_width()) * size_t(c.hidden_size));
  widest = std::max(widest, c.hidden_size);
  plan_small_matrix_scratch(plan, ctx_.small, most, widest, team_.size());
}

// The block input u = mix(X) into normed_.xn, and its BF16 copy into normed_.xb.
void Qwen4ExpModel::block_input(const HyperConnectionWeights& hc, const PassRows& rows) {
  const int64_t n = rows.size(), H = config_.hidden_size;
  hyper_mix(ctx_, hc_spec_, hc, rows.x, n, hc_, normed_.xn);
  ctx_.rows(n, [&](int64_t begin, int64_t end) {
    convert_f32_to_bf16(normed_.xn + begin * H, normed_.xb + begin * H, (end - begin) * H);
  });
}

// One decoder layer over the rows (X: [n][hc_count][hidden]):
//   X = X + ple(X)                                  at the n-gram layers
//   u = mix(X); X_s = X_s + w_s mixer(u)            Gated DeltaNet, or QSA
//   u = mix(X); X_s = X_s + w_s (moe(u) + shared(u))
void Qwen4ExpModel::layer(int64_t l, const PassRows& rows) {
  const Qwen4ExpLayer& L = weights_.layers[l];
  const int64_t n = rows.size(), H = config_.hidden_size;
  if (L.ple)
    ngram_embedding(ctx_, ple_spec_, *L.ple, memory_, ple_index_[l], rows, ple_);

  block_input(L.attn_hc, rows);
  if (L.is_linear) {
    std::fill_n(block_out_, n * H, 0.0f);  // the block adds its output to its rows
    gated_deltanet(ctx_, deltanet_spec_, L.deltanet, memory_, state_layer_[l],
                   {rows.tokens, block_out_, rows.rope_cos, rows.rope_sin}, normed_.xb, deltanet_);
  } else {
    sparse_attention(ctx_, qsa_spec_, L.attention, memory_.kv(), kv_layer_[l], rows, normed_.xn,
                     normed_.xb, rope_, qsa_, block_out_);
  }
  hyper_inject(ctx_, hc_spec_, hc_, block_out_, n, rows.x);

  block_input(L.mlp_hc, rows);
  std::fill_n(block_out_, n * H, 0.0f);
  moe(ctx_, moe_spec_, L.moe, normed_, n, moe_, block_out_);
  shared_expert(ctx_, L.shared_expert, normed_, n, H, shared_, block_out_);
  hyper_inject(ctx_, hc_spec_, hc_, block_out_, n, rows.x);
}

// The final mixer in place of the final norm, over the wanted rows gathered.
void Qwen4ExpModel::lm_head_input(const float* x, const int32_t* rows, int64_t n) {
  const int64_t W = residual_width();
  ctx_.rows(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) std::copy_n(x + rows[i] * W, W, final_x_ + i * W);
  });
  hyper_mix(ctx_, hc_spec_, weights_.mixer, final_x_, n, hc_, normed_.xn);
}

void Qwen4ExpModel::for_each_matrix(const MatrixFn& fn) {
  auto swiglu_matrices = [&](SwiGluWeights& s) {
    fn(s.gate_up);
    fn(s.down);
  };
  for (Qwen4ExpLayer& L : weights_.layers) {
    for (PackedWeights* w : {&L.attention.attention.qkv, &L.attention.attention.o_proj, &L.deltanet.qkvz,
                             &L.deltanet.ba, &L.deltanet.out_proj})
      fn(*w);
    for (SwiGluWeights& e : L.moe.experts) swiglu_matrices(e);
    swiglu_matrices(L.shared_expert.mlp);
  }
  fn(weights_.lm_head);
}

void Qwen4ExpModel::describe(std::string& line) const {
  const MappedTableStatus table = mapped_table();
  char resident[32];
  std::snprintf(resident, sizeof resident, "%.1f%%", table.bytes ? 100.0 * double(table.resident_bytes) / double(table.bytes) : 0.0);
  line += ", " + std::to_string(extra_.hc_count) + " residual streams, recurrent state " +
          format_bytes(double(state_bytes_per_slot())) + " per slot, n-gram table " +
          format_bytes(double(table.bytes)) + " mapped (" + resident + " resident" +
          (table.locked ? ", locked)" : ")");
  describe_tower(line);
}

MappedTableStatus Qwen4ExpModel::mapped_table() const {
  MappedTableStatus total;
  for (const auto& p : weights_.ple) {
    const MappedTableStatus s = p->table.status();
    total.bytes += s.bytes;
    total.resident_bytes += s.resident_bytes;
    total.locked = s.locked;
    total.major_faults += s.major_faults;
    total.minor_faults += s.minor_faults;
    total.gathered_tokens = std::max(total.gathered_tokens, s.gathered_tokens);
  }
  return total;
}

void Qwen4ExpModel::evict_mapped_table() {
  for (const auto& p : weights_.ple) p->table.evict();
}

// Bump the version whenever the KV rows' or the state's meaning changes. Per QSA layer: K, V
// (f16, RoPE on the rotary dims), then per position the indexer's raw key and block key (f32)
// and the position's (T, H, W) rope position (f32, -1: its text position).
// State: per Gated DeltaNet layer the conv window then S; then per n-gram module its window of
// the last tokens' rows (rmsnorm(gv), id).
std::string Qwen4ExpModel::kv_format() const {
  const ModelConfig& c = config_;
  return "qwen4exp-kv v2 " + std::string(kv_format_tag(memory_.kv().dtype())) + " layers=" + std::to_string(c.num_hidden_layers) +
         " kv_heads=" + std::to_string(c.num_key_value_heads) + " head_dim=" + std::to_string(c.head_dim) +
         " rotary=" + std::to_string(c.rotary_dim()) + " " + rope_format(c) +
         " index=f32[2][" + std::to_string(extra_.indexer_head_dim) + "]+rope[4] state=f32 conv[" +
         std::to_string(c.linear_conv_kernel_dim - 1) + "][" + std::to_string(c.conv_dim()) + "] S[" +
         std::to_string(c.linear_num_value_heads) + "][" + std::to_string(c.linear_key_head_dim) + "][" +
         std::to_string(c.linear_value_head_dim) + "] ple=" + std::to_string(extra_.ple_layers.size()) + "x[" +
         std::to_string(ple_spec_.history_rows()) + "][" + std::to_string(ple_spec_.row_floats()) +
         "] streams=" + std::to_string(extra_.hc_count);
}

namespace {

Qwen4ExpConfig read_extra_fields(const std::string& model_dir, const ModelConfig& config) {
  const std::string path = model_dir + "/config.json";
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  ModelConfig reread = config;
  reread.linear_attention.clear();
  return parse_qwen4exp_fields(json::parse(text.str()), path, reread);
}

}  // namespace

Qwen4ExpModel::Qwen4ExpModel(const std::string& model_dir, const ModelConfig& config,
                             const ServingLimits& limits, std::shared_ptr<ThreadTeam> team)
    : Qwen4ExpModel(model_dir, config, read_extra_fields(model_dir, config), limits, std::move(team)) {}

}  // namespace ellm
