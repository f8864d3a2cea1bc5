// 4-bit checkpoints (GPTQ, AWQ) and `--quantize int4`: quantization_config checks with one-line
// errors naming the field, what stays BF16, a sharded MoE GPTQ checkpoint with a module split
// across its shards, act-order inputs, and --quantize int4's fidelity against BF16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "kernels/kernels.h"
#include "model/config.h"
#include "tools/hf_config.h"
#include "model/load/int4_weights.h"
#include "model/model.h"
#include "model/arch/qwen3.h"
#include "model/arch/qwen35.h"
#include "model_test_util.h"
#include "tools/int4_checkpoint.h"
#include "tools/make_model.h"
#include "tiers_under_test.h"

namespace ellm {
namespace {

using test::run_tokens;
using test::load_error;

// INT4 products on BF16 inputs unless told: the comparisons with BF16 twins below are about the
// weights, not the int8 inputs (golden_test.cc checks those).
ServingLimits int4_limits(bool quantize_int4 = false, ActivationDtype activations = ActivationDtype::bf16) {
  ServingLimits l;
  l.sequence_length = 128;
  l.chunk_size = 128;
  l.threads = 2;
  l.quantize_int4 = quantize_int4;
  l.activations = activations;
  return l;
}

std::string config_error(const std::string& quantization) {
  std::string text = model_config_json(test::small_dense_config());
  text.insert(text.rfind('}'), ", \"quantization_config\": " + quantization);
  std::string message = test::error_of([&] { parse_model_config(text, "config.json"); });
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  return message;
}

TEST(Int4Config, FormatsAndSpellings) {
  std::string text = model_config_json(test::small_dense_config());
  auto parse = [&](const std::string& q) {
    std::string t = text;
    t.insert(t.rfind('}'), ", \"quantization_config\": " + q);
    return parse_model_config(t, "config.json");
  };
  ModelConfig gptq = parse(R"({"quant_method": "gptq", "bits": 4, "group_size": 128,
                               "desc_act": true, "sym": false, "checkpoint_format": "gptq_v2",
                               "dynamic": {"-:.*mlp.gate": {}}})");
  EXPECT_EQ(gptq.quant_method, "gptq");
  EXPECT_EQ(gptq.int4.format, "gptq_v2");
  EXPECT_EQ(gptq.int4.group_size, 128);
  EXPECT_EQ(parse(R"({"quant_method": "gptq", "bits": 4, "group_size": -1})").int4.format, "gptq");
  ModelConfig awq = parse(R"({"quant_method": "awq", "version": "gemm", "zero_point": true,
                              "q_group_size": 64, "w_bit": 4})");
  EXPECT_EQ(awq.int4.format, "awq");
  EXPECT_EQ(awq.int4.group_size, 64);
}

TEST(Int4Config, UnsupportedVariantsNameTheField) {
  EXPECT_EQ(config_error(R"({"quant_method": "gptq", "bits": 8, "group_size": 128})"),
            "config.json: quantization_config.bits 8 is not supported (only 4-bit weights)");
  EXPECT_EQ(config_error(R"({"quant_method": "awq", "w_bit": 3, "q_group_size": 128})"),
            "config.json: quantization_config.w_bit 3 is not supported (only 4-bit weights)");
  EXPECT_EQ(config_error(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"})"),
            "config.json: quantization_config.version 'gemv' is not supported (only \"gemm\")");
  EXPECT_EQ(config_error(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "marlin"})"),
            "config.json: quantization_config.version 'marlin' is not supported (only \"gemm\")");
  EXPECT_EQ(config_error(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": false})"),
            "config.json: quantization_config.zero_point false is not supported (only true)");
  EXPECT_EQ(config_error(R"({"quant_method": "gptq", "bits": 4, "group_size": 128,
                             "checkpoint_format": "marlin"})"),
            "config.json: quantization_config.checkpoint_format 'marlin' is not supported (only "
            "\"gptq\" or \"gptq_v2\")");
  EXPECT_EQ(config_error(R"({"quant_method": "gptq", "bits": 4, "group_size": 0})"),
            "config.json: quantization_config.group_size 0 is not supported (a positive number of "
            "inputs, or -1 for all of them)");
  EXPECT_EQ(config_error(R"({"quant_method": "gptq", "group_size": 128})"),
            "config.json: quantization_config has no 'bits'");
  EXPECT_EQ(config_error(R"({"quant_method": "gptq", "bits": 4, "group_size": 128,
                             "dynamic": {"+:.*down_proj": {"bits": 8}}})"),
            "config.json: quantization_config.dynamic rule '+:.*down_proj' changes a module's "
            "quantisation: not supported");
}

// The shared 4-bit models: every decoder linear weight INT4, in groups of 32; embeddings and
// lm_head BF16. (Their goldens run in golden_test.cc.)
TEST(Int4Load, SharedModelsLoadAsInt4) {
  for (const std::string name : {"tiny-qwen3-gptq", "tiny-qwen3-awq"}) {
    const std::string dir = test::shared_dir() + "/models/" + name;
    const ModelConfig config = load_model_config(dir);
    Qwen3Weights w = load_qwen3_weights(dir, config, active_isa());
    for (const Qwen3Layer& L : w.layers)
      for (const PackedWeights* m : {&L.attention.qkv, &L.attention.o_proj, &L.mlp.gate_up, &L.mlp.down}) {
        EXPECT_TRUE(m->int4) << name;
        EXPECT_EQ(m->group, 32) << name;
        EXPECT_FALSE(m->k_order) << name;  // desc_act false
      }
    EXPECT_FALSE(w.lm_head.int4);
    EXPECT_GT(w.int4_bytes, 0u);
  }
}

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// make-model's sharded MoE GPTQ checkpoint: some module's tensors lie in two shards; it gives the
// bits of the same checkpoint in one file, and the logits of its BF16 twin holding the 4-bit
// values rounded to BF16, up to that rounding.
TEST(Int4Load, ShardedMoeGptqWithAModuleAcrossShards) {
  ModelConfig config = test::small_moe_config();
  test::ScratchDir sharded, single, as_bf16;
  write_random_model(config, sharded.path, 3, 3, {}, "gptq");
  write_random_model(config, single.path, 3, 1, {}, "gptq");
  write_random_model(config, as_bf16.path, 3, 1, {}, "gptq-as-bf16");
  auto index = nlohmann::json::parse(test::read_text(sharded / "model.safetensors.index.json"));
  std::map<std::string, std::set<std::string>> files_of_module;
  for (auto& [name, file] : index["weight_map"].items())
    for (const char* suffix : {".qweight", ".qzeros", ".scales", ".g_idx"})
      if (has_suffix(name, suffix))
        files_of_module[name.substr(0, name.size() - std::string(suffix).size())].insert(file);
  int split = 0;
  for (auto& [module, files] : files_of_module) split += files.size() > 1;
  ASSERT_GT(split, 0) << "no module split across shards";

  const std::vector<int32_t> tokens = {5, 17, 300, 2, 99, 411, 7, 8, 250, 13};
  std::vector<float> a = run_tokens(*Model::load(sharded.path, int4_limits()), tokens);
  std::vector<float> b = run_tokens(*Model::load(single.path, int4_limits()), tokens);
  EXPECT_EQ(a, b);
  std::vector<float> c = run_tokens(*Model::load(as_bf16.path, int4_limits()), tokens);
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i) largest = std::max(largest, double(std::fabs(a[i] - c[i])));
  std::printf("[int4 moe] sharded GPTQ vs its BF16-rounded twin: max |dlogit| %.4f\n", largest);
  EXPECT_LT(largest, 0.05);
  EXPECT_GT(largest, 0.0);  // the INT4 path really ran
}

// The hybrid generation in 4 bits: a Qwen3.5 GPTQ-Int4-shaped model (qwen3.5-0.8b) and a
// Qwen3.6-35B-A3B AWQ-shaped one (per-expert 4-bit experts, the router and in_proj_a/b BF16), cut
// to 4 layers (3 Gated DeltaNet, 1 full attention) and to hidden 256 / 8 experts, in 2 shards:
// they load as INT4 and give the logits of their BF16-rounded twins, on both activation paths,
// far nearer than the 4 bits moved them from the BF16 model they were rounded from. (The
// recurrent layers carry small differences along, so not as near as the dense models above.)
TEST(Int4Load, Qwen35GptqAndQwen36AwqLoadAndRun) {
  for (const auto& [preset, format] : {std::pair{"qwen3.5-0.8b", "gptq"}, std::pair{"qwen3.6-35b-a3b", "awq"}}) {
    ModelConfig config = preset_config(preset);
    config.num_hidden_layers = 4;
    config.linear_attention = {true, true, true, false};
    config.vocab_size = 1024;
    config.hidden_size = 256;
    if (config.is_moe()) config.num_experts = 8;
    else config.intermediate_size = 512;
    test::ScratchDir int4, as_bf16, original;
    write_random_model(config, int4.path, 9, /*shards=*/2, {}, format);
    write_random_model(config, as_bf16.path, 9, 1, {}, std::string(format) + "-as-bf16");
    write_random_model(config, original.path, 9, 1, {}, "bf16");
    const ModelConfig loaded = load_model_config(int4.path);
    EXPECT_EQ(loaded.quant_method, format);
    Qwen35Weights w = load_qwen35_weights(int4.path, loaded, active_isa());
    for (const Qwen35Layer& L : w.layers) {
      const PackedWeights& mixer = L.is_linear ? L.deltanet.qkvz : L.attention.qkv;
      EXPECT_TRUE(mixer.int4) << preset;
      EXPECT_FALSE(L.is_linear && L.deltanet.ba.int4) << preset;  // in_proj_a/b stay BF16
      EXPECT_TRUE(L.is_moe ? L.moe.experts[0].down.int4 && L.shared_expert.mlp.gate_up.int4
                           : L.mlp.gate_up.int4) << preset;
    }
    const std::vector<int32_t> tokens = {5, 17, 300, 2, 99, 411, 7, 8, 250, 13};
    auto largest_difference = [](const std::vector<float>& a, const std::vector<float>& b) {
      double largest = 0;
      for (size_t i = 0; i < a.size(); ++i) largest = std::max(largest, double(std::fabs(a[i] - b[i])));
      return largest;
    };
    const std::vector<float> ref = run_tokens(*Model::load(as_bf16.path, int4_limits()), tokens);
    const double moved = largest_difference(ref, run_tokens(*Model::load(original.path, int4_limits()), tokens));
    for (ActivationDtype activations : {ActivationDtype::bf16, ActivationDtype::int8}) {
      const std::vector<float> got = run_tokens(*Model::load(int4.path, int4_limits(false, activations)), tokens);
      const double largest = largest_difference(ref, got);
      const bool int8 = activations == ActivationDtype::int8;
      std::printf("[int4 %s %s, %s activations] vs its BF16-rounded twin: max |dlogit| %.4f "
                  "(4 bits moved the BF16 model's by %.3f)\n", preset, format, int8 ? "int8" : "BF16",
                  largest, moved);
      EXPECT_LT(largest, (int8 ? 0.25 : 0.1) * moved) << preset;
    }
  }
}

// Rows that are not whole 32-column blocks (k_proj and v_proj of 80 rows, fused after q_proj's
// 160): both formats give the logits of their BF16-rounded twins, up to that rounding.
TEST(Int4Load, ModulesNotInWholeBlocks) {
  ModelConfig config = test::small_dense_config();
  config.head_dim = 40;
  for (const std::string format : {"gptq", "awq"}) {
    test::ScratchDir int4, as_bf16;
    write_random_model(config, int4.path, 8, 1, {}, format);
    write_random_model(config, as_bf16.path, 8, 1, {}, format + "-as-bf16");
    const std::vector<int32_t> tokens = {5, 17, 300, 2, 99, 411, 7, 8};
    std::vector<float> a = run_tokens(*Model::load(int4.path, int4_limits()), tokens);
    std::vector<float> b = run_tokens(*Model::load(as_bf16.path, int4_limits()), tokens);
    double largest = 0;
    for (size_t i = 0; i < a.size(); ++i) largest = std::max(largest, double(std::fabs(a[i] - b[i])));
    std::printf("[int4 %s, head_dim 40] vs its BF16-rounded twin: max |dlogit| %.4f\n",
                format.c_str(), largest);
    EXPECT_LT(largest, 0.05) << format;
  }
}

// --quantize int4 rounds to nearest: every weight of every layer's q_proj lies within half a step
// of its 4-bit value.
TEST(Int4Quantize, EveryWeightWithinHalfAStep) {
  const std::string dir = test::shared_dir() + "/models/tiny-qwen3";
  const ModelConfig config = load_model_config(dir);
  Qwen3Weights q = load_qwen3_weights(dir, config, active_isa(), false, true);
  SafetensorsStore store = SafetensorsStore::open(dir);
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const TensorInfo& t = store.get("model.layers." + std::to_string(l) + ".self_attn.q_proj.weight");
    const PackedWeights& w = q.layers[l].attention.qkv;
    ASSERT_TRUE(w.int4);
    for (int64_t j = 0; j < t.shape[0]; ++j)
      for (int64_t i = 0; i < t.shape[1]; ++i) {
        bf16 v;
        std::memcpy(&v, t.data + 2 * (j * t.shape[1] + i), 2);
        const size_t g = int4_group_index(w, j, i / w.group);
        const float value = w.scales[g] * (float(int4_code(w, j, i)) - float(w.zeros[g]));
        ASSERT_LE(std::fabs(value - bf16_to_f32(v)), 0.5001f * w.scales[g]) << l << " " << j << " " << i;
      }
  }
}

// --quantize int4 is deterministic and, on the golden feeds, reported against BF16 beside
// --quantize fp8 (mean KL, top-1 agreement at clear margins, largest |dlogit|). The random tiny
// models have large weights, so 4 bits move their logits much more than a trained model's; the
// bounds guard against regressions.
TEST(Int4Quantize, DeterministicAndFidelityAgainstBf16) {
  for (const std::string name : {"tiny-qwen3", "tiny-qwen3-moe"}) {
    const std::string dir = test::shared_dir() + "/models/" + name;
    const ModelConfig config = load_model_config(dir);
    Qwen3Weights first = load_qwen3_weights(dir, config, active_isa(), false, true);
    Qwen3Weights second = load_qwen3_weights(dir, config, active_isa(), false, true);
    const PackedWeights &x = first.layers[0].attention.qkv, &y = second.layers[0].attention.qkv;
    ASSERT_TRUE(x.int4);
    EXPECT_EQ(x.group, 64);  // the largest divisor of hidden 64 up to 128
    const size_t codes = size_t((x.n + 31) / 32 * x.k * 16), params = size_t((x.n + 31) / 32 * x.groups * 32);
    EXPECT_EQ(0, std::memcmp(x.codes.get(), y.codes.get(), codes));
    EXPECT_EQ(0, std::memcmp(x.scales.get(), y.scales.get(), params * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(x.zeros.get(), y.zeros.get(), params));
    EXPECT_FALSE(first.lm_head.int4);
    EXPECT_TRUE(load_qwen3_weights(dir, config, active_isa(), false, true, /*quantize_lm_head=*/true).lm_head.int4);

    auto session = nlohmann::json::parse(test::read_text(test::shared_dir() + "/golden/" + name +
                                                         "/session.json"));
    const double margin_min = session["margin_min"];
    std::vector<int32_t> tokens;
    for (const auto& feed : session["feeds"]) for (int32_t id : feed) tokens.push_back(id);
    auto bf16 = Model::load(dir, int4_limits());
    auto int4 = Model::load(dir, int4_limits(true));
    auto int4_int8 = Model::load(dir, int4_limits(true, ActivationDtype::int8));

    ServingLimits fp8_limits = int4_limits();
    fp8_limits.quantize_fp8 = true;
    auto fp8 = Model::load(dir, fp8_limits);
    EXPECT_LT(int4->weight_bytes(), fp8->weight_bytes());
    const std::vector<float> ref = run_tokens(*bf16, tokens);
    const int64_t V = bf16->vocab_size();
    const test::Fidelity f4 = test::fidelity(ref, run_tokens(*int4, tokens), V, margin_min);
    const test::Fidelity f4q = test::fidelity(ref, run_tokens(*int4_int8, tokens), V, margin_min);
    const test::Fidelity f8 = test::fidelity(ref, run_tokens(*fp8, tokens), V, margin_min);

    std::printf("[int4 fidelity %s %s] vs BF16 over %zu positions: INT4 on BF16 activations %s; "
                "INT4 on int8 activations %s; FP8 %s\n", name.c_str(), isa_name(active_isa()),
                tokens.size(), f4.summary(margin_min).c_str(), f4q.summary(margin_min).c_str(),
                f8.summary(margin_min).c_str());
    for (const std::string shared : {name + "-gptq", name + "-awq"}) {
      const std::string shared_dir = test::shared_dir() + "/models/" + shared;
      if (!std::filesystem::exists(shared_dir)) continue;
      auto other = Model::load(shared_dir, int4_limits());
      const test::Fidelity f = test::fidelity(ref, run_tokens(*other, tokens), bf16->vocab_size(), margin_min);
      std::printf("[int4 fidelity %s] the shared %s (groups of 32) vs BF16: %s\n", name.c_str(),
                  shared.c_str(), f.summary(margin_min).c_str());
    }
    EXPECT_GE(f4.top1(), 0.2) << name;
    EXPECT_LT(f4.mean_kl, 6.0) << name;
    EXPECT_GE(f4q.top1(), 0.1) << name;
    EXPECT_LT(f4q.mean_kl, 6.0) << name;
  }
}

}  // namespace
}  // namespace ellm

namespace ellm {
namespace {

// A copy of the single-file checkpoint in `from` (config.json, tensors) into `to`, with `edit`
// changing the tensors (name -> dtype, shape and bytes) first.
struct RawTensor {
  TensorSpec spec;
  std::vector<uint8_t> bytes;
};
using RawTensors = std::map<std::string, RawTensor>;

void copy_checkpoint(const std::string& from, const std::string& to,
                     const std::function<void(RawTensors&)>& edit) {
  SafetensorsStore store = SafetensorsStore::open(from);
  RawTensors tensors;
  for (auto& [name, t] : store.tensors())
    tensors[name] = {{name, t.shape, t.dtype_name}, std::vector<uint8_t>(t.data, t.data + t.bytes)};
  edit(tensors);
  std::vector<TensorSpec> specs;
  std::vector<const std::vector<uint8_t>*> data;
  for (auto& [name, t] : tensors) {
    specs.push_back(t.spec);
    data.push_back(&t.bytes);
  }
  std::vector<size_t> all(specs.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  std::filesystem::create_directories(to);
  test::write_text(to + "/config.json", test::read_text(from + "/config.json"));
  write_safetensors_bytes(to + "/model.safetensors", specs, all,
                          [&](size_t t, int64_t first, int64_t count, uint8_t* out) {
                            const size_t element = dtype_size(specs[t].dtype);
                            std::memcpy(out, data[t]->data() + first * element, count * element);
                          });
}

int32_t word_at(const RawTensor& t, int64_t i) {
  int32_t v;
  std::memcpy(&v, t.bytes.data() + 4 * i, 4);
  return v;
}

// GPTQ v1 module `module` ([rows][k]) dequantised straight from its tensors, g_idx as stored.
std::vector<bf16> dequantise_gptq(RawTensors& t, const std::string& module, int64_t rows, int64_t k) {
  const RawTensor &qweight = t[module + ".qweight"], &qzeros = t[module + ".qzeros"],
                  &scales = t[module + ".scales"], &g_idx = t[module + ".g_idx"];
  std::vector<bf16> out(size_t(rows * k));
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t i = 0; i < k; ++i) {
      const int64_t g = word_at(g_idx, i);
      const int q = (word_at(qweight, (i / 8) * rows + o) >> (4 * (i % 8))) & 15;
      const int zero = ((word_at(qzeros, g * ((rows + 7) / 8) + o / 8) >> (4 * (o % 8))) & 15) + 1;
      uint16_t s;
      std::memcpy(&s, scales.bytes.data() + 2 * (g * rows + o), 2);
      out[o * k + i] = f32_to_bf16(f16_to_f32(s) * float(q - zero));
    }
  return out;
}

// Act-order GPTQ (g_idx a permutation of the groups, as desc_act writes it): the loader sorts the
// inputs by group once and the kernels gather x to match; that gives the logits of the same
// checkpoint read without reordering (one fused part BF16, so the others are dequantised through
// g_idx directly), up to BF16 rounding of those weights. A fused part ordered differently is an
// error naming the module.
TEST(Int4Load, ActOrderInputsAreReorderedOnceAtLoad) {
  ModelConfig config = test::small_dense_config();
  config.hidden_size = 96;  // groups of 32 (make-model's choice): 3 groups to reorder
  const int64_t H = config.hidden_size, KV = config.kv_dim();
  test::ScratchDir plain, act_order, reference, clash;
  write_random_model(config, plain.path, 5, 1, {}, "gptq");
  const int64_t group = load_model_config(plain.path).int4.group_size;
  std::vector<int32_t> g_idx(static_cast<size_t>(H));
  std::iota(g_idx.begin(), g_idx.end(), 0);
  std::shuffle(g_idx.begin(), g_idx.end(), std::mt19937(11));
  for (int32_t& g : g_idx) g = int32_t(g / group);
  auto set_g_idx = [&](RawTensors& t, const std::string& module) {
    std::memcpy(t[module + ".g_idx"].bytes.data(), g_idx.data(), g_idx.size() * 4);
  };
  const std::string attn = "model.layers.0.self_attn.";
  auto reorder_qkv = [&](RawTensors& t) {
    for (const char* m : {"q_proj", "k_proj", "v_proj"}) set_g_idx(t, attn + m);
  };
  copy_checkpoint(plain.path, act_order.path, reorder_qkv);
  copy_checkpoint(plain.path, reference.path, [&](RawTensors& t) {
    reorder_qkv(t);
    const std::vector<bf16> k = dequantise_gptq(t, attn + "k_proj", KV, H);
    for (const char* suffix : {".qweight", ".qzeros", ".scales", ".g_idx"}) t.erase(attn + "k_proj" + suffix);
    RawTensor& w = t[attn + "k_proj.weight"];
    w.spec = {attn + "k_proj.weight", {KV, H}, "BF16"};
    w.bytes.resize(k.size() * 2);
    std::memcpy(w.bytes.data(), k.data(), w.bytes.size());
  });
  copy_checkpoint(plain.path, clash.path, [&](RawTensors& t) { set_g_idx(t, attn + "k_proj"); });

  Qwen3Weights weights = load_qwen3_weights(act_order.path, load_model_config(act_order.path), active_isa());
  ASSERT_TRUE(weights.layers[0].attention.qkv.int4);
  EXPECT_TRUE(weights.layers[0].attention.qkv.k_order);
  EXPECT_FALSE(weights.layers[0].attention.o_proj.k_order);
  EXPECT_FALSE(load_qwen3_weights(reference.path, load_model_config(reference.path), active_isa())
                   .layers[0].attention.qkv.int4);

  const std::vector<int32_t> tokens = {5, 17, 300, 2, 99, 411, 7, 8};
  const Isa active = active_isa();
  for (Isa isa : test::tiers_under_test()) {
    set_active_isa(isa);  // before loading: weights are packed for it
    std::vector<float> a = run_tokens(*Model::load(act_order.path, int4_limits()), tokens);
    std::vector<float> b = run_tokens(*Model::load(reference.path, int4_limits()), tokens);
    std::vector<float> c = run_tokens(*Model::load(plain.path, int4_limits()), tokens);
    double largest = 0, moved = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      largest = std::max(largest, double(std::fabs(a[i] - b[i])));
      moved = std::max(moved, double(std::fabs(a[i] - c[i])));
    }
    std::printf("[int4 act-order %s] vs read through g_idx: max |dlogit| %.4f (vs in order: %.3f)\n",
                isa_name(isa), largest, moved);
    EXPECT_LT(largest, 0.05) << isa_name(isa);
    EXPECT_GT(moved, 10 * largest) << isa_name(isa);  // the reordering matters
  }
  set_active_isa(active);
  std::string message = test::error_of([&] { Model::load(clash.path, int4_limits()); });
  EXPECT_EQ(message, clash / "model.safetensors" + ": module '" + attn +
                         "k_proj' orders its inputs (g_idx) unlike the modules fused with it");
}

}  // namespace
}  // namespace ellm

namespace ellm {
namespace {

// A GPTQ v1 file re-written as gptq_v2 (zero points stored as they are) gives the same bits.
TEST(Int4Load, GptqV2StoresZerosAsTheyAre) {
  test::ScratchDir v1, v2;
  write_random_model(test::small_dense_config(), v1.path, 4, 1, {}, "gptq");
  copy_checkpoint(v1.path, v2.path, [](RawTensors& t) {
    for (auto& [name, tensor] : t)
      if (name.ends_with(".qzeros"))
        for (size_t i = 0; i < tensor.bytes.size(); i += 4) {
          uint32_t word, out = 0;
          std::memcpy(&word, tensor.bytes.data() + i, 4);
          for (int n = 0; n < 8; ++n) out |= (((word >> (4 * n)) + 1) & 15) << (4 * n);
          std::memcpy(tensor.bytes.data() + i, &out, 4);
        }
  });
  std::string config = test::read_text(v2 / "config.json");
  config.replace(config.find("\"checkpoint_format\": \"gptq\""), 27, "\"checkpoint_format\": \"gptq_v2\"");
  test::write_text(v2 / "config.json", config);
  const std::vector<int32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6};
  EXPECT_EQ(run_tokens(*Model::load(v1.path, int4_limits()), tokens),
            run_tokens(*Model::load(v2.path, int4_limits()), tokens));
}

// Bad 4-bit tensors: one line naming the file, the tensor and the problem.
TEST(Int4Load, BadTensorsNameTheProblem) {
  test::ScratchDir good;
  write_random_model(test::small_dense_config(), good.path, 4, 1, {}, "gptq");
  const std::string module = "model.layers.1.mlp.down_proj";  // [64][128], groups of 64
  auto broken = [&](const std::function<void(RawTensors&)>& edit) {
    auto dir = std::make_unique<test::ScratchDir>();
    copy_checkpoint(good.path, dir->path, edit);
    return dir;
  };
  auto d1 = broken([&](RawTensors& t) { t[module + ".qweight"].spec.dtype = "F32"; });
  EXPECT_EQ(load_error(d1->path, int4_limits()), *d1 / "model.safetensors" + ": tensor '" + module +
                                      ".qweight' has dtype F32, expected I32");
  auto d2 = broken([&](RawTensors& t) {
    RawTensor& s = t[module + ".scales"];
    s.spec.shape = {1, 128};
    s.bytes.resize(256);
  });
  EXPECT_EQ(load_error(d2->path, int4_limits()), *d2 / "model.safetensors" + ": tensor '" + module +
                                      ".scales' has shape [1, 128], expected [2, 64] (64 x 128 "
                                      "GPTQ weight, groups of 64)");
  auto d3 = broken([&](RawTensors& t) { t.erase(module + ".qzeros"); });
  EXPECT_EQ(load_error(d3->path, int4_limits()),
            *d3 / "model.safetensors" + ": missing tensor '" + module + ".qzeros'");
  auto d4 = broken([&](RawTensors& t) {
    int32_t bad = 2;
    std::memcpy(t[module + ".g_idx"].bytes.data() + 4 * 5, &bad, 4);
  });
  EXPECT_EQ(load_error(d4->path, int4_limits()), *d4 / "model.safetensors" + ": tensor '" + module +
                                      ".g_idx' holds group 2 at 5, outside [0, 2)");
  auto d5 = broken([&](RawTensors& t) {
    int32_t other = 1;  // input 5 moves to group 1: 63 and 65 inputs
    std::memcpy(t[module + ".g_idx"].bytes.data() + 4 * 5, &other, 4);
  });
  EXPECT_EQ(load_error(d5->path, int4_limits()), *d5 / "model.safetensors" + ": tensor '" + module +
                                      ".g_idx' does not give every group 64 inputs");
  // 4-bit tensors without a quantization_config, and a group size the inputs do not divide.
  auto d6 = broken([](RawTensors&) {});
  ModelConfig plain = test::small_dense_config();
  test::write_text(*d6 / "config.json", model_config_json(plain));
  EXPECT_EQ(load_error(d6->path, int4_limits()),
            *d6 / "model.safetensors" + ": tensor 'model.layers.0.self_attn.q_proj.qweight' is "
                  "4-bit, but config.json has no GPTQ or AWQ quantization_config");
  plain.quant_method = "gptq";
  plain.int4 = {"gptq", 48};
  test::write_text(*d6 / "config.json", model_config_json(plain));
  EXPECT_EQ(load_error(d6->path, int4_limits()), *d6 / "model.safetensors" +
                                      ": module 'model.layers.0.self_attn.q_proj' has 64 inputs, "
                                      "not a multiple of group_size 48");
}

}  // namespace
}  // namespace ellm

namespace ellm {
namespace {

// make-model's 4-bit writer against the independently made shared checkpoints: tiny-qwen3's BF16
// weights on each format's grid, in groups of 32, packed as that format's tensors, give the
// shared tiny-qwen3-gptq and tiny-qwen3-awq files' bytes.
TEST(Int4Checkpoint, WriterMatchesTheSharedFiles) {
  const std::string models = test::shared_dir() + "/models/";
  SafetensorsStore plain = SafetensorsStore::open(models + "tiny-qwen3");
  for (const std::string format : {"gptq", "awq"}) {
    SafetensorsStore shared = SafetensorsStore::open(models + "tiny-qwen3-" + format);
    int64_t tensors = 0, differing_bytes = 0;
    for (auto& [name, t] : plain.tensors()) {
      if (name.rfind("model.layers.", 0) != 0 || !has_suffix(name, "_proj.weight")) continue;
      const int64_t rows = t.shape[0], k = t.shape[1];
      std::vector<float> values(size_t(rows * k));
      for (int64_t i = 0; i < rows * k; ++i) {
        bf16 v;
        std::memcpy(&v, t.data + 2 * i, 2);
        values[i] = bf16_to_f32(v);
      }
      const Int4Grid grid = quantise_int4_grid(values, rows, k, 32, format);
      for (const TensorSpec& spec : int4_module_tensors({name, t.shape, "BF16"}, format, 32)) {
        const TensorInfo& want = shared.get(spec.name);
        ASSERT_EQ(want.shape, spec.shape) << spec.name;
        ASSERT_EQ(want.dtype_name, spec.dtype) << spec.name;
        std::vector<uint8_t> got(want.bytes);
        int64_t count = 1;
        for (int64_t d : spec.shape) count *= d;
        int4_tensor_bytes(grid, format, spec.name, 0, count, got.data());
        for (size_t i = 0; i < got.size(); ++i) differing_bytes += got[i] != want.data[i];
        ++tensors;
      }
    }
    EXPECT_EQ(tensors, 3 * 7 * (format == "gptq" ? 4 : 3));
    EXPECT_EQ(differing_bytes, 0) << format;
  }
}

}  // namespace
}  // namespace ellm
