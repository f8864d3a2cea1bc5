#include "tools/make_qwen4exp.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "base/error.h"
#include "model/blocks/ngram_embedding.h"
#include "model/load/tensor_loader.h"
#include "tools/hf_config.h"
#include "tools/make_model.h"
#include "tools/random_checkpoint.h"
#include "tools/vision_checkpoint.h"

namespace ellm {
namespace {

const std::string kRoot = "model.language_model.";

// The Qwen3.5 hybrid fields both presets share: heads of 256 with RoPE on their first 64 dims
// (1/4), GDN heads of 128 with a conv of 4 taps, a sigmoid-gated shared expert.
ModelConfig hybrid_moe(int64_t vocab, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                       int64_t key_heads, int64_t value_heads, int64_t gdn_dim, int64_t experts,
                       int64_t per_token, int64_t expert_ffn) {
  ModelConfig c;
  c.architecture = "Qwen4ExpForConditionalGeneration";
  c.model_type = "qwen4_exp";
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.max_position_embeddings = 262144;
  c.rope_theta = 10000000.0;
  c.partial_rotary_factor = 0.25;
  c.rms_norm_eps = 1e-6;
  c.linear_num_key_heads = key_heads;
  c.linear_num_value_heads = value_heads;
  c.linear_key_head_dim = c.linear_value_head_dim = gdn_dim;
  c.linear_conv_kernel_dim = 4;
  c.num_experts = experts;
  c.num_experts_per_tok = per_token;
  c.moe_intermediate_size = c.shared_expert_intermediate_size = expert_ffn;
  c.norm_topk_prob = true;
  return c;
}

// Where a tensor's values come from: random_element(seed, first + e) (a per-expert tensor is its
// slice of the fused tensor's values, so the BF16 and FP8 models agree), or the table's scale, or
// the hash constants.
struct Source {
  enum Kind { random, fp8_factors, table_scale, int64 } kind = random;
  uint64_t seed = 0;
  int64_t first = 0;
  bool norm = false;
  std::vector<int64_t> values;  // int64
};

struct Planned {
  TensorSpec spec;
  Source source;
};

class Planner {
 public:
  Planner(const Qwen4ExpShape& shape, bool fp8, uint64_t seed)
      : c_(shape.config), x_(shape.extra), vision_(shape.vision), fp8_(fp8), seed_(seed) {}

  std::vector<Planned> plan() {
    const int64_t H = c_.hidden_size, V = c_.vocab_size;
    add(kRoot + "embed_tokens.weight", {V, H});
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      const std::string p = kRoot + "layers." + std::to_string(l) + ".";
      const auto ple = std::find(x_.ple_layers.begin(), x_.ple_layers.end(), l);
      if (ple != x_.ple_layers.end()) add_ple(p + "ple.", ple - x_.ple_layers.begin());
      add_hyper_connection(p + "attn_hyper_connection.", true);
      if (c_.is_linear_layer(l)) add_deltanet(p + "linear_attn.");
      else add_attention(p + "self_attn.");
      add_hyper_connection(p + "mlp_hyper_connection.", true);
      add_mlp(p + "mlp.");
    }
    add_hyper_connection(kRoot + "hyper_connection_mixer.", false);
    add("lm_head.weight", {V, H});
    if (vision_)
      for (const TensorSpec& t : vision_tensors(*vision_)) add(t.name, t.shape, "", 0, t.dtype);
    return std::move(planned_);
  }

 private:
  // A tensor of random values (one of a fused tensor's slices: `from` and `first`), as F8_E4M3
  // with its factors after it when it is a matrix an FP8 checkpoint quantises.
  void add(const std::string& name, std::vector<int64_t> shape, const std::string& from = "", int64_t first = 0,
           const std::string& dtype = "BF16") {
    Source s;
    s.seed = tensor_seed(seed_, from.empty() ? name : from);
    s.first = first;
    s.norm = name.find("norm") != std::string::npos;
    // The embedding and lm_head stay BF16, as do the router, the shared expert's gate and the
    // GDN's in_proj_a / in_proj_b.
    const bool decoder = name.rfind(kRoot + "layers.", 0) == 0 || name.rfind(kRoot + "hyper_connection_mixer.", 0) == 0;
    const bool kept = name.ends_with("mlp.gate.weight") || name.ends_with("shared_expert_gate.weight") ||
                      name.ends_with("in_proj_a.weight") || name.ends_with("in_proj_b.weight");
    if (!fp8_ || shape.size() != 2 || !decoder || kept) {
      planned_.push_back({{name, shape, dtype}, s});
      return;
    }
    planned_.push_back({{name, shape, "F8_E4M3"}, s});
    s.kind = Source::fp8_factors;
    planned_.push_back({{name + "_scale_inv",
                         {(shape[0] + kFp8BlockK - 1) / kFp8BlockK, (shape[1] + kFp8BlockK - 1) / kFp8BlockK},
                         "BF16"},
                        s});
  }

  void add_hyper_connection(const std::string& p, bool inject) {
    const int64_t W = x_.hc_count * c_.hidden_size, r = x_.hc_lowrank;
    add(p + "hc_norm.weight", {W});
    add(p + "input_mix_weight_down.weight", {r, W});
    add(p + "input_mix_weight_up.weight", {W, r});
    if (inject) add(p + "block_inject_weight.weight", {x_.hc_count, W});
  }

  void add_deltanet(const std::string& a) {
    const int64_t H = c_.hidden_size, Hv = c_.linear_num_value_heads, CD = c_.conv_dim(), VD = c_.linear_value_dim();
    add(a + "in_proj_qkv.weight", {CD, H});
    add(a + "in_proj_z.weight", {VD, H});
    add(a + "in_proj_b.weight", {Hv, H});
    add(a + "in_proj_a.weight", {Hv, H});
    add(a + "conv1d.weight", {CD, 1, c_.linear_conv_kernel_dim});
    add(a + "A_log", {Hv}, "", 0, "F32");
    add(a + "dt_bias", {Hv}, "", 0, "F32");
    add(a + "norm.weight", {c_.linear_value_head_dim});
    add(a + "out_proj.weight", {H, VD});
  }

  void add_attention(const std::string& a) {
    const int64_t H = c_.hidden_size, d = x_.indexer_head_dim;
    add(a + "q_proj.weight", {2 * c_.q_dim(), H});  // per head [query | gate]
    add(a + "k_proj.weight", {c_.kv_dim(), H});
    add(a + "v_proj.weight", {c_.kv_dim(), H});
    add(a + "q_norm.weight", {c_.head_dim});
    add(a + "k_norm.weight", {c_.head_dim});
    add(a + "o_proj.weight", {H, c_.q_dim()});
    add(a + "indexer.index_qk_proj.weight", {(x_.indexer_heads + 1) * d, H});
    add(a + "indexer.q_layernorm.weight", {d});
    add(a + "indexer.k_layernorm.weight", {d});
  }

  // The experts fused in BF16, one by one in FP8 (each its slice of the fused values).
  void add_mlp(const std::string& m) {
    const int64_t H = c_.hidden_size, E = c_.num_experts, F = c_.moe_intermediate_size;
    const int64_t S = c_.shared_expert_intermediate_size;
    add(m + "gate.weight", {E, H});
    const std::string gate_up = m + "experts.gate_up_proj", down = m + "experts.down_proj";
    if (!fp8_) {
      add(gate_up, {E, 2 * F, H});
      add(down, {E, H, F});
    } else {
      for (int64_t e = 0; e < E; ++e) {
        const std::string p = m + "experts." + std::to_string(e) + ".";
        add(p + "gate_proj.weight", {F, H}, gate_up, e * 2 * F * H);
        add(p + "up_proj.weight", {F, H}, gate_up, (e * 2 + 1) * F * H);
        add(p + "down_proj.weight", {H, F}, down, e * H * F);
      }
    }
    add(m + "shared_expert.gate_proj.weight", {S, H});
    add(m + "shared_expert.up_proj.weight", {S, H});
    add(m + "shared_expert.down_proj.weight", {H, S});
    add(m + "shared_expert_gate.weight", {1, H});
  }

  void add_ple(const std::string& p, int64_t module) {
    const int64_t H = c_.hidden_size, W = x_.hc_count * H, E = x_.ple_embed_dim;
    add(p + "key_proj.weight", {W, E});
    add(p + "value_proj.weight", {H, E});
    add(p + "norm_key.weight", {W});
    add(p + "norm_query.weight", {W});
    add(p + "norm_conv.weight", {W});
    add(p + "conv1d.weight", {W, 1, x_.ple_conv_kernel_size});
    NgramEmbeddingSpec spec{H, x_.hc_count, E, x_.ngram_size, x_.heads_per_ngram, x_.ple_conv_kernel_size,
                            c_.vocab_size, x_.ngram_vocab_size_base, x_.ngram_vocab_divisor, x_.seed, module,
                            x_.eos, float(c_.rms_norm_eps)};
    const NgramHash hash = ngram_hash(spec);
    const std::string e = p + "ple_embedding.";
    for (const auto& [name, values] : {std::pair{"layer_multipliers", &hash.multipliers},
                                       std::pair{"ngram_heads_vocab_sizes", &hash.sizes},
                                       std::pair{"ngram_heads_offsets", &hash.offsets}}) {
      Source s;
      s.kind = Source::int64;
      s.values = *values;
      planned_.push_back({{e + name, {int64_t(values->size())}, "I64"}, s});
    }
    // The table's rows, split evenly over its shards in order.
    const int64_t parts = x_.split_ngram_parts, D = spec.row_dim();
    for (int64_t k = 0; k < parts; ++k) {
      const int64_t rows = hash.rows * (k + 1) / parts - hash.rows * k / parts;
      const std::string name = e + "ngram_embedding.shard_" + std::to_string(k) + ".weight";
      Source s;
      s.seed = tensor_seed(seed_, name);
      planned_.push_back({{name, {rows, D}, fp8_ ? "F8_E4M3" : "BF16"}, s});
    }
    if (fp8_) {
      Source s;
      s.kind = Source::table_scale;
      planned_.push_back({{e + "ngram_embedding.weight_scale", {}, "F32"}, s});
    }
  }

  const ModelConfig& c_;
  const Qwen4ExpConfig& x_;
  const std::optional<VisionConfig>& vision_;
  bool fp8_;
  uint64_t seed_;
  std::vector<Planned> planned_;
};

bool is_table_shard(const std::string& name) { return name.find("ngram_embedding.shard_") != std::string::npos; }

}  // namespace

float qwen4exp_table_scale() { return fp8_block_factor(largest_random_element()); }

std::vector<std::string> qwen4exp_preset_names() { return {"tiny-qwen4exp", "qwen3.8-flash-next"}; }

bool is_qwen4exp_preset(const std::string& name) {
  for (const std::string& n : qwen4exp_preset_names())
    if (n == name) return true;
  return false;
}

Qwen4ExpShape qwen4exp_preset(const std::string& name) {
  Qwen4ExpShape s;
  Qwen4ExpConfig& x = s.extra;
  x.hc_count = 4;
  x.ple_layers = {1};
  x.ngram_size = 3;
  x.ngram_vocab_divisor = 128;
  x.seed = 1234;
  x.ple_conv_kernel_size = 4;
  x.indexer_heads = 4;
  x.indexer_ratio = 4;
  if (name == "tiny-qwen4exp") {  // as ../shared/models/tiny-qwen4exp
    s.config = hybrid_moe(151936, 64, 4, 2, 64, 2, 4, 32, 8, 2, 32);
    x.hc_lowrank = 16;
    x.ple_embed_dim = 64;
    x.heads_per_ngram = 2;
    x.ngram_vocab_size_base = 1000;
    x.split_ngram_parts = 4;
    x.indexer_head_dim = 32;
    x.indexer_budget = 32;
    x.eos = 151643;
    set_qwen4exp_layers(s, 8);
  } else if (name == "qwen3.8-flash-next") {  // ../shared/QWEN38_NEXT.md
    s.config = hybrid_moe(248320, 2560, 24, 2, 256, 16, 48, 128, 512, 10, 640);
    x.hc_lowrank = 320;
    x.ple_embed_dim = 2560;
    x.heads_per_ngram = 8;
    x.ngram_vocab_size_base = 20000000;
    x.split_ngram_parts = 128;
    x.indexer_head_dim = 128;
    x.indexer_budget = 2048;
    x.eos = 248044;
    set_qwen4exp_layers(s, 48);
  } else {
    fail("--preset", "unknown Qwen3.8-Flash-Next preset '" + name + "'");
  }
  s.vision = preset_vision_config(name, s.config.hidden_size);
  return s;
}

void set_qwen4exp_layers(Qwen4ExpShape& shape, int64_t layers) {
  if (layers < 1) fail("--layers", "must be positive");
  shape.config.num_hidden_layers = layers;
  shape.config.linear_attention.clear();
  for (int64_t l = 0; l < layers; ++l) shape.config.linear_attention.push_back((l + 1) % 4 != 0);
  for (int64_t& l : shape.extra.ple_layers) l = std::min(l, layers - 1);
}

std::vector<TensorSpec> qwen4exp_tensors(const Qwen4ExpShape& shape, bool fp8) {
  std::vector<TensorSpec> specs;
  for (Planned& p : Planner(shape, fp8, 0).plan()) specs.push_back(std::move(p.spec));
  return specs;
}

void write_random_qwen4exp(Qwen4ExpShape shape, const std::string& out_dir, uint64_t seed, int shards,
                           const SpecialTokenIds& special, const std::string& dtype) {
  if (dtype != "bf16" && dtype != "fp8")
    fail("--dtype", "Qwen3.8-Flash-Next is written as bf16 or fp8, not '" + dtype + "'");
  const bool fp8 = dtype == "fp8";
  ModelConfig& c = shape.config;
  if (fp8) c.quant_method = "fp8";
  if (special.endoftext >= 0) shape.extra.eos = special.endoftext;
  if (special.image_pad < 0) shape.vision.reset();  // a tower needs the tokenizer's <|image_pad|>
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) fail(out_dir, "cannot create directory (" + ec.message() + ")");
  std::string config_json = qwen4exp_config_json(c, shape.extra);
  if (shape.vision) {
    config_json = with_vision_config(config_json, *shape.vision, special);
    write_text(out_dir + "/preprocessor_config.json", preprocessor_config_json(*shape.vision));
  }
  write_text(out_dir + "/config.json", config_json);
  write_generation_config(out_dir, special.endoftext, special.im_end);

  const std::vector<Planned> plan = Planner(shape, fp8, seed).plan();
  std::vector<TensorSpec> specs;
  uint64_t table_bytes = 0;
  for (const Planned& p : plan) {
    specs.push_back(p.spec);
    if (is_table_shard(p.spec.name)) table_bytes += tensor_bytes(p.spec);
  }
  const bool table_holes = table_bytes > kLargestWrittenTable;
  const float scale = qwen4exp_table_scale();
  std::vector<std::vector<float>> factors(plan.size());  // of the FP8 matrices, when first asked
  auto factors_of = [&](size_t t) -> const std::vector<float>& {
    if (factors[t].empty())
      factors[t] = random_fp8_factors(plan[t].source.seed, plan[t].source.first, specs[t].shape[0],
                                      specs[t].shape[1], /*bf16_factors=*/true);
    return factors[t];
  };
  const TensorBytesFill fill = [&](size_t t, int64_t first, int64_t count, uint8_t* out) {
    const TensorSpec& spec = specs[t];
    const Source& s = plan[t].source;
    auto value = [&](int64_t e) { return random_element(s.seed, s.first + e, s.norm); };
    if (s.kind == Source::int64) {
      std::memcpy(out, s.values.data() + first, size_t(count) * 8);
    } else if (s.kind == Source::table_scale) {
      std::memcpy(out, &scale, 4);
    } else if (s.kind == Source::fp8_factors) {
      const std::vector<float>& f = factors_of(t - 1);
      for (int64_t i = 0; i < count; ++i) {
        const bf16 v = f32_to_bf16(f[size_t(first + i)]);  // exact: rounded up to BF16 already
        std::memcpy(out + 2 * i, &v, 2);
      }
    } else if (spec.dtype == "F8_E4M3" && is_table_shard(spec.name)) {
      for (int64_t i = 0; i < count; ++i) out[i] = fp8_quantise(bf16_to_f32(value(first + i)), scale);
    } else if (spec.dtype == "F8_E4M3") {
      const std::vector<float>& f = factors_of(t);
      for (int64_t i = 0; i < count; ++i)
        out[i] = fp8_quantise(bf16_to_f32(value(first + i)), block_factor(f, spec.shape[1], first + i));
    } else if (spec.dtype == "F32") {
      for (int64_t i = 0; i < count; ++i) {
        const float v = bf16_to_f32(value(first + i));
        std::memcpy(out + 4 * i, &v, 4);
      }
    } else {
      for (int64_t i = 0; i < count; ++i) {
        const bf16 v = value(first + i);
        std::memcpy(out + 2 * i, &v, 2);
      }
    }
  };
  write_checkpoint_files(out_dir, specs, shards, fill,
                         [&](size_t t) { return table_holes && is_table_shard(specs[t].name); });
}

}  // namespace ellm
