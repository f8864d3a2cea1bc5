#include "tools/make_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/log.h"
#include "kernels/kernels.h"
#include "model/load/tensor_loader.h"
#include "tools/hf_config.h"
#include "tools/int4_checkpoint.h"
#include "tools/make_qwen4exp.h"
#include "tools/random_checkpoint.h"
#include "tools/vision_checkpoint.h"

namespace ellm {
namespace {

namespace fs = std::filesystem;

ModelConfig dense(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                  int64_t head_dim, int64_t ffn, bool tied) {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 151936;
  c.hidden_size = hidden;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.intermediate_size = ffn;
  c.max_position_embeddings = 40960;
  c.rope_theta = 1000000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = tied;
  return c;
}

ModelConfig moe(ModelConfig c, int64_t experts, int64_t per_token, int64_t expert_ffn) {
  c.architecture = "Qwen3MoeForCausalLM";
  c.num_experts = experts;
  c.num_experts_per_tok = per_token;
  c.moe_intermediate_size = expert_ffn;
  c.norm_topk_prob = true;
  c.decoder_sparse_step = 1;
  return c;
}

// The Qwen3.5 generation (docs/models/qwen35.md): three Gated DeltaNet layers to one of gated
// attention, head_dim 256 with RoPE on its first 64 dims, GDN heads of 128, vocabulary 248,320.
ModelConfig hybrid(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                   int64_t v_heads, int64_t ffn, bool tied) {
  ModelConfig c = dense(hidden, layers, heads, kv_heads, 256, ffn, tied);
  c.architecture = "Qwen3_5ForConditionalGeneration";
  c.model_type = "qwen3_5";
  c.vocab_size = 248320;
  c.max_position_embeddings = 262144;
  c.rope_theta = 10000000.0;
  c.partial_rotary_factor = 0.25;
  for (int64_t l = 0; l < layers; ++l) c.linear_attention.push_back((l + 1) % 4 != 0);
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = v_heads;
  c.linear_key_head_dim = c.linear_value_head_dim = 128;
  c.linear_conv_kernel_dim = 4;
  return c;
}

ModelConfig hybrid_moe(ModelConfig c, int64_t experts, int64_t per_token, int64_t expert_ffn) {
  c.architecture = "Qwen3_5MoeForConditionalGeneration";
  c.model_type = "qwen3_5_moe";
  c.intermediate_size = 0;
  c.num_experts = experts;
  c.num_experts_per_tok = per_token;
  c.moe_intermediate_size = c.shared_expert_intermediate_size = expert_ffn;
  c.norm_topk_prob = true;
  return c;
}

// A norm's gain (near 1): the decoder's RMSNorms, the tower's LayerNorms (norm1, norm2).
bool is_norm(const std::string& name) {
  for (const char* gain : {"norm.weight", "norm1.weight", "norm2.weight"})
    if (name.find(gain) != std::string::npos) return true;
  return false;
}

// A decoder layer's linear weight: what Qwen's FP8 checkpoints store as F8_E4M3 (Qwen3.5: not
// the Gated DeltaNet's small in_proj_a / in_proj_b, nor the router and shared-expert gate).
bool is_fp8_linear(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() > suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  const bool layer = name.rfind("model.layers.", 0) == 0 ||
                     name.rfind("model.language_model.layers.", 0) == 0;
  return layer && (ends_with("_proj.weight") || ends_with("in_proj_qkv.weight") ||
                   ends_with("in_proj_z.weight"));
}

// The FP8 checkpoint's tensors for `specs`: each decoder layer's linear weight as F8_E4M3 with
// its F32 factors [ceil(rows / 128)][ceil(cols / 128)] right after it.
std::vector<TensorSpec> fp8_tensors(const std::vector<TensorSpec>& specs) {
  std::vector<TensorSpec> out;
  for (const TensorSpec& s : specs) {
    out.push_back(s);
    if (!is_fp8_linear(s.name)) continue;
    out.back().dtype = "F8_E4M3";
    out.push_back({s.name + "_scale_inv",
                   {(s.shape[0] + kFp8BlockK - 1) / kFp8BlockK, (s.shape[1] + kFp8BlockK - 1) / kFp8BlockK},
                   "F32"});
  }
  return out;
}

// The 4-bit checkpoint's tensors for `specs`: each decoder layer's linear weight as a GPTQ or AWQ
// module (int4_checkpoint.h).
std::vector<TensorSpec> int4_tensors(const std::vector<TensorSpec>& specs, const std::string& format,
                                     int64_t group) {
  std::vector<TensorSpec> out;
  for (const TensorSpec& s : specs) {
    if (!is_fp8_linear(s.name)) {
      out.push_back(s);
      continue;
    }
    for (TensorSpec& t : int4_module_tensors(s, format, group)) out.push_back(t);
  }
  return out;
}

// Groups of 128 inputs, or 64 or 32 when a linear weight's inputs need it (the tiny presets).
int64_t int4_group_for(const ModelConfig& c) {
  for (int64_t group : {128, 64, 32}) {
    bool divides = c.hidden_size % group == 0 && c.q_dim() % group == 0;
    if (c.intermediate_size) divides = divides && c.intermediate_size % group == 0;
    if (c.is_moe()) divides = divides && c.moe_intermediate_size % group == 0;
    if (divides) return group;
  }
  fail("--dtype", "no 4-bit group size of 32, 64 or 128 divides every input dimension");
}

// The name of the BF16 weight a tensor's values come from: the module's .weight for its 4-bit
// tensors, so a 4-bit model quantises its BF16 twin of the same seed.
std::string source_name(const std::string& name) {
  for (const char* suffix : {".qweight", ".qzeros", ".scales", ".g_idx"}) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0)
      return name.substr(0, name.size() - s.size()) + ".weight";
  }
  return name;
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"tiny",     "tiny-moe",      "qwen3-0.6b",   "qwen3-1.7b",     "qwen3-4b",
          "qwen3-8b", "qwen3-30b-a3b", "qwen3.5-0.8b", "qwen3.6-27b", "qwen3.6-35b-a3b"};
}

ModelConfig preset_config(const std::string& name) {
  if (name == "tiny") return dense(64, 3, 4, 2, 32, 128, true);
  if (name == "tiny-moe") {
    ModelConfig c = moe(dense(64, 4, 4, 2, 32, 128, false), 32, 8, 32);
    c.mlp_only_layers = {2};
    return c;
  }
  if (name == "qwen3-0.6b") return dense(1024, 28, 16, 8, 128, 3072, true);
  if (name == "qwen3-1.7b") return dense(2048, 28, 16, 8, 128, 6144, true);
  if (name == "qwen3-4b") return dense(2560, 36, 32, 8, 128, 9728, true);
  if (name == "qwen3-8b") return dense(4096, 36, 32, 8, 128, 12288, false);
  if (name == "qwen3-30b-a3b") return moe(dense(2048, 48, 32, 4, 128, 6144, false), 128, 8, 768);
  if (name == "qwen3.5-0.8b") return hybrid(1024, 24, 8, 2, 16, 3584, true);
  if (name == "qwen3.6-27b") return hybrid(5120, 64, 24, 4, 48, 17408, false);  // = Qwen3.8-27B
  if (name == "qwen3.6-35b-a3b")
    return hybrid_moe(hybrid(2048, 40, 16, 2, 32, 0, false), 256, 8, 512);
  std::string list;
  for (const std::string& n : preset_names()) list += (list.empty() ? "" : ", ") + n;
  for (const std::string& n : qwen4exp_preset_names()) list += ", " + n;
  fail("--preset", "unknown preset '" + name + "' (known: " + list + ")");
}

namespace {

// self_attn's tensors under prefix p; q_rows: Qwen3.5's q_proj holds [query | gate] per head.
void add_attention(std::vector<TensorSpec>& specs, const std::string& p, const ModelConfig& c,
                   int64_t q_rows) {
  const int64_t h = c.hidden_size, hd = c.head_dim;
  specs.push_back({p + "self_attn.q_proj.weight", {q_rows, h}});
  specs.push_back({p + "self_attn.k_proj.weight", {c.kv_dim(), h}});
  specs.push_back({p + "self_attn.v_proj.weight", {c.kv_dim(), h}});
  specs.push_back({p + "self_attn.q_norm.weight", {hd}});
  specs.push_back({p + "self_attn.k_norm.weight", {hd}});
  specs.push_back({p + "self_attn.o_proj.weight", {h, c.q_dim()}});
}

// A SwiGLU MLP's gate_proj, up_proj, down_proj under prefix p ("mlp.", "mlp.experts.3.", ...).
void add_swiglu(std::vector<TensorSpec>& specs, const std::string& p, int64_t ffn, int64_t h) {
  specs.push_back({p + "gate_proj.weight", {ffn, h}});
  specs.push_back({p + "up_proj.weight", {ffn, h}});
  specs.push_back({p + "down_proj.weight", {h, ffn}});
}

// Qwen3.5's layout: the text model under model.language_model., lm_head at the top level.
std::vector<TensorSpec> qwen35_tensors(const ModelConfig& c, bool fused_experts) {
  std::vector<TensorSpec> specs;
  const int64_t h = c.hidden_size, Hv = c.linear_num_value_heads;
  const int64_t F = c.moe_intermediate_size, E = c.num_experts;
  const std::string root = "model.language_model.";
  specs.push_back({root + "embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string p = root + "layers." + std::to_string(l) + ".";
    specs.push_back({p + "input_layernorm.weight", {h}});
    if (c.is_linear_layer(l)) {
      const std::string a = p + "linear_attn.";
      specs.push_back({a + "in_proj_qkv.weight", {c.conv_dim(), h}});
      specs.push_back({a + "in_proj_z.weight", {c.linear_value_dim(), h}});
      specs.push_back({a + "in_proj_b.weight", {Hv, h}});
      specs.push_back({a + "in_proj_a.weight", {Hv, h}});
      specs.push_back({a + "conv1d.weight", {c.conv_dim(), 1, c.linear_conv_kernel_dim}});
      specs.push_back({a + "A_log", {Hv}});
      specs.push_back({a + "dt_bias", {Hv}});
      specs.push_back({a + "norm.weight", {c.linear_value_head_dim}});
      specs.push_back({a + "out_proj.weight", {h, c.linear_value_dim()}});
    } else {
      add_attention(specs, p, c, 2 * c.q_dim());
    }
    specs.push_back({p + "post_attention_layernorm.weight", {h}});
    if (!c.is_moe()) {
      add_swiglu(specs, p + "mlp.", c.intermediate_size, h);
      continue;
    }
    specs.push_back({p + "mlp.gate.weight", {E, h}});
    if (fused_experts) {  // gate rows before up rows in each expert's gate_up_proj
      specs.push_back({p + "mlp.experts.gate_up_proj", {E, 2 * F, h}});
      specs.push_back({p + "mlp.experts.down_proj", {E, h, F}});
    } else {
      for (int64_t e = 0; e < E; ++e) add_swiglu(specs, p + "mlp.experts." + std::to_string(e) + ".", F, h);
    }
    add_swiglu(specs, p + "mlp.shared_expert.", c.shared_expert_intermediate_size, h);
    specs.push_back({p + "mlp.shared_expert_gate.weight", {1, h}});
  }
  specs.push_back({root + "norm.weight", {h}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, h}});
  return specs;
}

}  // namespace

std::vector<TensorSpec> checkpoint_tensors(const ModelConfig& c, bool fused_experts) {
  if (c.is_hybrid()) return qwen35_tensors(c, fused_experts);
  std::vector<TensorSpec> specs;
  int64_t h = c.hidden_size;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    specs.push_back({p + "input_layernorm.weight", {h}});
    add_attention(specs, p, c, c.q_dim());
    specs.push_back({p + "post_attention_layernorm.weight", {h}});
    if (c.is_moe_layer(l)) {
      specs.push_back({p + "mlp.gate.weight", {c.num_experts, h}});
      for (int64_t e = 0; e < c.num_experts; ++e)
        add_swiglu(specs, p + "mlp.experts." + std::to_string(e) + ".", c.moe_intermediate_size, h);
    } else {
      add_swiglu(specs, p + "mlp.", c.intermediate_size, h);
    }
  }
  specs.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, h}});
  return specs;
}

std::string preset_tokenizer(const std::string& preset) {
  return preset == "qwen3.8-flash-next" ? "qwen35" : "qwen3";
}

void make_model(const MakeModelOptions& o) {
  if (o.layers < 0) fail("--layers", "must be positive");
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    if (!fs::exists(fs::path(o.tokenizer_dir) / file))
      fail(o.tokenizer_dir + "/" + file, "missing (pass --tokenizer-from DIR with the Qwen tokenizer files)");
  if (o.dtype != "bf16" && o.dtype != "fp8" && o.dtype != "gptq" && o.dtype != "awq")
    fail("--dtype", "must be bf16, fp8, gptq or awq, not '" + o.dtype + "'");
  const bool qwen38 = o.preset == "qwen3.8-flash-next";
  if (is_qwen4exp_preset(o.preset)) {
    if (o.fused_experts)
      fail("--fused-experts", "Qwen3.8-Flash-Next's BF16 checkpoints always fuse their experts, its FP8 ones never");
    Qwen4ExpShape shape = qwen4exp_preset(o.preset);
    if (o.layers > 0) set_qwen4exp_layers(shape, o.layers);
    if (!o.vision) shape.vision.reset();
    write_random_qwen4exp(shape, o.out_dir, o.seed, o.shards, read_special_token_ids(o.tokenizer_dir), o.dtype);
  } else {
    ModelConfig config = preset_config(o.preset);
    if (o.layers > 0) config.num_hidden_layers = o.layers;
    if (config.is_hybrid()) {  // the layer pattern, cut or extended to the depth
      config.linear_attention.clear();
      for (int64_t l = 0; l < config.num_hidden_layers; ++l)
        config.linear_attention.push_back((l + 1) % 4 != 0);
    }
    const std::optional<VisionConfig> vision =
        o.vision ? preset_vision_config(o.preset, config.hidden_size) : std::nullopt;
    write_random_model(config, o.out_dir, o.seed, o.shards, read_special_token_ids(o.tokenizer_dir),
                       o.dtype, o.fused_experts, vision ? &*vision : nullptr);
  }
  std::error_code ec;
  for (const std::string file : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    fs::path from = fs::path(o.tokenizer_dir) / file;
    // Qwen3.8's own template and tokenizer config where the folder has them (shared/text/qwen35).
    const fs::path qwen38_file = fs::path(o.tokenizer_dir) / (fs::path(file).stem().string() + "_qwen38" +
                                                             fs::path(file).extension().string());
    if (qwen38 && fs::exists(qwen38_file)) from = qwen38_file;
    if (!fs::exists(from)) continue;
    fs::path to = fs::path(o.out_dir) / file;
    fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
    if (ec) fail(from.string(), "cannot copy (" + ec.message() + ")");
    fs::permissions(to, fs::perms::owner_write, fs::perm_options::add, ec);
  }
}

SpecialTokenIds read_special_token_ids(const std::string& tokenizer_dir) {
  const std::string path = tokenizer_dir + "/tokenizer.json";
  std::ifstream f(path);
  if (!f) fail(path, "cannot open");
  SpecialTokenIds ids;
  try {
    for (const auto& added : nlohmann::json::parse(f).value("added_tokens", nlohmann::json::array())) {
      const std::string content = added.value("content", "");
      if (content == "<|endoftext|>") ids.endoftext = added.value("id", -1);
      if (content == "<|im_end|>") ids.im_end = added.value("id", -1);
      if (content == "<|image_pad|>") ids.image_pad = added.value("id", -1);
      if (content == "<|video_pad|>") ids.video_pad = added.value("id", -1);
      if (content == "<|vision_start|>") ids.vision_start = added.value("id", -1);
      if (content == "<|vision_end|>") ids.vision_end = added.value("id", -1);
    }
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("unexpected structure: ") + e.what());
  }
  return ids;
}

void write_random_model(ModelConfig config, const std::string& out_dir, uint64_t seed, int shards,
                        const SpecialTokenIds& special, const std::string& dtype,
                        bool fused_experts, const VisionConfig* vision) {
  if (shards < 1) fail("--shards", "must be at least 1");
  const bool fp8 = dtype == "fp8", as_bf16 = dtype == "gptq-as-bf16" || dtype == "awq-as-bf16";
  const std::string int4_format = dtype.rfind("gptq", 0) == 0 ? "gptq"
                                  : dtype.rfind("awq", 0) == 0 ? "awq"
                                                               : "";
  const int64_t group = int4_format.empty() ? 0 : int4_group_for(config);
  if (fused_experts && !(config.is_hybrid() && config.is_moe()))
    fail("--fused-experts", "only Qwen3.5 MoE checkpoints fuse their experts");
  if (fused_experts && dtype != "bf16")
    fail("--fused-experts", "Qwen's FP8 and 4-bit checkpoints store their experts one by one (BF16 only)");
  if (fp8) config.quant_method = "fp8";
  if (!int4_format.empty() && !as_bf16) {
    config.quant_method = int4_format;
    config.int4 = {int4_format, group};
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) fail(out_dir, "cannot create directory (" + ec.message() + ")");

  if (vision && !config.is_hybrid())
    fail(out_dir, "only a Qwen3.5-generation model carries a vision tower");
  std::string config_json = model_config_json(config, special.endoftext, special.im_end);
  if (vision) {
    config_json = with_vision_config(config_json, *vision, special);
    write_text(out_dir + "/preprocessor_config.json", preprocessor_config_json(*vision));
  }
  write_text(out_dir + "/config.json", config_json);
  write_generation_config(out_dir, special.endoftext, special.im_end);

  // Weights: random_element, the same values whatever the dtype (an FP8 model is its BF16 twin
  // of the same seed quantised by fp8_quantise).
  std::vector<TensorSpec> specs = checkpoint_tensors(config, fused_experts);
  if (vision)
    for (TensorSpec& t : vision_tensors(*vision)) specs.push_back(std::move(t));
  std::unordered_map<std::string, std::vector<int64_t>> shape_of;
  for (const TensorSpec& s : specs) shape_of[s.name] = s.shape;
  if (fp8) specs = fp8_tensors(specs);
  if (!int4_format.empty() && !as_bf16) specs = int4_tensors(specs, int4_format, group);
  std::vector<uint64_t> tensor_seeds(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) tensor_seeds[i] = tensor_seed(seed, source_name(specs[i].name));
  // The factors of FP8 tensor t, [ceil(rows / 128)][ceil(cols / 128)], computed when first asked.
  std::vector<std::vector<float>> factors(specs.size());
  auto factors_of = [&](size_t t) -> const std::vector<float>& {
    if (factors[t].empty())
      factors[t] = random_fp8_factors(tensor_seeds[t], 0, specs[t].shape[0], specs[t].shape[1]);
    return factors[t];
  };
  // The 4-bit grid of the module being written (its tensors are consecutive, across shards too).
  std::string grid_of;
  Int4Grid grid;
  auto grid_for = [&](size_t t) -> const Int4Grid& {
    const std::string weight = source_name(specs[t].name);
    if (grid_of == weight) return grid;
    const int64_t rows = shape_of[weight][0], cols = shape_of[weight][1];
    std::vector<float> values(size_t(rows * cols));
    for (int64_t e = 0; e < rows * cols; ++e)
      values[e] = bf16_to_f32(random_element(tensor_seeds[t], e, false));
    grid = quantise_int4_grid(values, rows, cols, group, int4_format);
    grid_of = weight;
    return grid;
  };
  TensorBytesFill fill = [&](size_t tensor, int64_t first, int64_t count, uint8_t* out) {
    const TensorSpec& spec = specs[tensor];
    if (source_name(spec.name) != spec.name) {
      int4_tensor_bytes(grid_for(tensor), int4_format, spec.name, first, count, out);
    } else if (as_bf16 && is_fp8_linear(spec.name)) {  // the 4-bit values, rounded to BF16
      const Int4Grid& g = grid_for(tensor);
      for (int64_t i = 0; i < count; ++i) {
        const bf16 v = f32_to_bf16(g.value((first + i) / g.k, (first + i) % g.k));
        std::memcpy(out + 2 * i, &v, 2);
      }
    } else if (spec.dtype == "F8_E4M3") {
      const std::vector<float>& f = factors_of(tensor);
      for (int64_t i = 0; i < count; ++i) {
        const int64_t e = first + i;
        out[i] = fp8_quantise(bf16_to_f32(random_element(tensor_seeds[tensor], e, false)),
                              block_factor(f, spec.shape[1], e));
      }
    } else if (spec.dtype == "F32") {  // the factors of the FP8 tensor before it
      const std::vector<float>& f = factors_of(tensor - 1);
      std::memcpy(out, f.data() + first, size_t(count) * sizeof(float));
    } else {
      const bool norm = is_norm(spec.name);
      for (int64_t i = 0; i < count; ++i) {
        bf16 v = random_element(tensor_seeds[tensor], first + i, norm);
        std::memcpy(out + 2 * i, &v, 2);
      }
    }
  };
  write_checkpoint_files(out_dir, specs, shards, fill);
}

}  // namespace ellm
