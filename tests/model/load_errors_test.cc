// Bad model folders and bad inputs: each gives one line naming the file and the problem.
#include <gtest/gtest.h>

#include <filesystem>

#include "model/blocks/ngram_embedding.h"
#include "model/config.h"
#include "tools/hf_config.h"
#include "tools/make_model.h"
#include "tools/make_qwen4exp.h"
#include "model/model.h"
#include "model_test_util.h"

namespace ellm {
namespace {

using test::error_of;
using test::load_error;

ServingLimits load_limits() {
  ServingLimits l;
  l.sequence_length = 16;
  l.chunk_size = 16;
  l.threads = 1;
  return l;
}

std::vector<TensorSpec> without(std::vector<TensorSpec> specs, const std::string& name) {
  auto it = std::find_if(specs.begin(), specs.end(), [&](auto& s) { return s.name == name; });
  EXPECT_NE(it, specs.end()) << name;
  specs.erase(it);
  return specs;
}

TEST(ModelLoad, GoodCheckpointsLoadAndRun) {
  for (const ModelConfig& config : {test::small_dense_config(), test::small_moe_config()}) {
    test::ScratchDir dir;
    test::write_checkpoint(dir.path, config, checkpoint_tensors(config));
    auto model = Model::load(dir.path, load_limits());
    std::vector<BatchToken> batch = {{1, 0, 0, false}, {2, 0, 1, true}};
    std::vector<float> logits(size_t(model->vocab_size()), NAN);
    model->forward(batch, logits.data());
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    EXPECT_GT(model->weight_bytes(), 0u);
    EXPECT_EQ(model->max_pass_tokens(), 17);
  }
}

TEST(ModelLoad, MissingConfig) {
  test::ScratchDir dir;
  EXPECT_EQ(load_error(dir.path, load_limits()).rfind(dir / "config.json" + ": cannot open", 0), 0u);
}

TEST(ModelLoad, UnknownArchitecture) {
  test::ScratchDir dir;
  ModelConfig config = test::small_dense_config();
  test::write_checkpoint(dir.path, config, checkpoint_tensors(config));
  std::string text = test::read_text(dir / "config.json");
  text.replace(text.find("Qwen3ForCausalLM"), 16, "MistralForCausalLM");
  test::write_text(dir / "config.json", text);
  EXPECT_EQ(load_error(dir.path, load_limits()), dir / "config.json" +
                                      ": unsupported architecture 'MistralForCausalLM' (expected "
                                      "Qwen3ForCausalLM or Qwen3MoeForCausalLM)");
}

TEST(ModelLoad, MissingTensor) {
  test::ScratchDir dir;
  ModelConfig config = test::small_dense_config();
  test::write_checkpoint(dir.path, config,
                         without(checkpoint_tensors(config), "model.layers.1.mlp.up_proj.weight"));
  EXPECT_EQ(load_error(dir.path, load_limits()),
            dir / "model.safetensors" + ": missing tensor 'model.layers.1.mlp.up_proj.weight'");
}

TEST(ModelLoad, WrongShape) {
  test::ScratchDir dir;
  ModelConfig config = test::small_dense_config();
  std::vector<TensorSpec> specs = checkpoint_tensors(config);
  for (TensorSpec& s : specs)
    if (s.name == "model.layers.0.self_attn.k_proj.weight") s.shape = {32, 64};
  test::write_checkpoint(dir.path, config, specs);
  EXPECT_EQ(load_error(dir.path, load_limits()),
            dir / "model.safetensors" +
                ": tensor 'model.layers.0.self_attn.k_proj.weight' has shape [32, 64], expected "
                "[64, 64] from config.json");
}

TEST(ModelLoad, WrongDtype) {
  test::ScratchDir dir;
  ModelConfig config = test::small_dense_config();
  test::write_checkpoint(dir.path, config, checkpoint_tensors(config));
  // Same element size, so the header stays consistent: only the dtype is wrong.
  std::string bytes = test::read_text(dir / "model.safetensors");
  bytes.replace(bytes.find("\"BF16\""), 6, "\"I16\" ");
  test::write_text(dir / "model.safetensors", bytes);
  EXPECT_EQ(load_error(dir.path, load_limits()), dir / "model.safetensors" +
                                      ": tensor 'model.embed_tokens.weight' has dtype I16, "
                                      "expected BF16, F16 or F32");
}

TEST(ModelLoad, TruncatedAndCorruptHeaders) {
  test::ScratchDir dir;
  ModelConfig config = test::small_dense_config();
  test::write_checkpoint(dir.path, config, checkpoint_tensors(config));
  std::string bytes = test::read_text(dir / "model.safetensors");
  test::write_text(dir / "model.safetensors", bytes.substr(0, 200));
  EXPECT_EQ(load_error(dir.path, load_limits()).rfind(dir / "model.safetensors" + ": header length", 0), 0u);
  bytes[20] = '\x01';
  test::write_text(dir / "model.safetensors", bytes);
  EXPECT_EQ(load_error(dir.path, load_limits()),
            dir / "model.safetensors" + ": corrupt safetensors header (not valid JSON)");
}

TEST(ModelLoad, IndexPointingAtMissingShard) {
  test::ScratchDir dir;
  write_random_model(test::small_dense_config(), dir.path, 1, 2);
  std::filesystem::remove(dir / "model-00002-of-00002.safetensors");
  EXPECT_EQ(load_error(dir.path, load_limits()), dir / "model.safetensors.index.json" +
                                      ": shard 'model-00002-of-00002.safetensors' does not exist");
}

TEST(ModelLoad, MissingExpertTensor) {
  test::ScratchDir dir;
  ModelConfig config = test::small_moe_config();
  test::write_checkpoint(
      dir.path, config,
      without(checkpoint_tensors(config), "model.layers.2.mlp.experts.5.down_proj.weight"));
  EXPECT_EQ(load_error(dir.path, load_limits()), dir / "model.safetensors" +
                                      ": missing tensor 'model.layers.2.mlp.experts.5.down_proj.weight'");
}

TEST(ModelLoad, WrongExpertCount) {
  ModelConfig config = test::small_moe_config();
  ModelConfig fewer = config;
  fewer.num_experts = 6;
  {  // the checkpoint has 8 experts (router and expert tensors), config.json says 6
    test::ScratchDir dir;
    test::write_checkpoint(dir.path, config, checkpoint_tensors(config));
    test::write_text(dir / "config.json", model_config_json(fewer));
    EXPECT_EQ(load_error(dir.path, load_limits()), dir / "model.safetensors" +
                                        ": layer 0 has more experts than num_experts = 6 in "
                                        "config.json");
  }
  {  // config.json says 8, the checkpoint has 6
    test::ScratchDir dir;
    test::write_checkpoint(dir.path, config, checkpoint_tensors(fewer));
    EXPECT_EQ(load_error(dir.path, load_limits()), dir / "model.safetensors" +
                                        ": tensor 'model.layers.0.mlp.gate.weight' has shape "
                                        "[6, 64], expected [8, 64] from config.json");
  }
}

// Qwen3.8-Flash-Next folders broken after make-model wrote them (tiny-qwen4exp with a
// vocabulary of 1024): the n-gram table, its hash constants, layer_types.
struct BrokenQwen4Exp {
  test::ScratchDir dir;
  Qwen4ExpShape shape = qwen4exp_preset("tiny-qwen4exp");
  const std::string table = "model.language_model.layers.1.ple.ple_embedding.";
  explicit BrokenQwen4Exp(const std::string& dtype = "bf16") {
    shape.config.vocab_size = 1024;
    shape.extra.eos = 1023;
    write_random_qwen4exp(shape, dir.path, 1, 1, {}, dtype);
    EXPECT_NO_THROW(Model::load(dir.path, load_limits()));
  }
  std::string file() const { return dir / "model.safetensors"; }
  std::string shard(int k) const { return table + "ngram_embedding.shard_" + std::to_string(k) + ".weight"; }
  void edit_header(const std::function<void(nlohmann::ordered_json&)>& edit) const {
    test::edit_safetensors_header(file(), edit);
  }
  NgramHash hash() const {
    const ModelConfig& c = shape.config;
    const Qwen4ExpConfig& x = shape.extra;
    return ngram_hash({c.hidden_size, x.hc_count, x.ple_embed_dim, x.ngram_size, x.heads_per_ngram,
                       x.ple_conv_kernel_size, c.vocab_size, x.ngram_vocab_size_base, x.ngram_vocab_divisor,
                       x.seed, 0, x.eos, 1e-6f});
  }
};

std::string list(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return "[" + s + "]";
}

TEST(Qwen4ExpLoad, MissingTableShard) {
  BrokenQwen4Exp m;
  m.edit_header([&](nlohmann::ordered_json& h) {  // shard 3 renamed away
    h[m.table + "ngram_embedding.shard_9.weight"] = h[m.shard(3)];
    h.erase(m.shard(3));
  });
  EXPECT_EQ(load_error(m.dir.path, load_limits()),
            m.file() + ": missing n-gram table shard '" + m.shard(3) + "' (split_ngram_parts is 4)");
}

TEST(Qwen4ExpLoad, TableShardWithTheWrongRowCount) {
  BrokenQwen4Exp m;
  m.edit_header([&](nlohmann::ordered_json& h) {  // shard 2: 1000 of its 1024 rows
    h[m.shard(2)]["shape"] = {1000, 16};
    h[m.shard(2)]["data_offsets"][1] = h[m.shard(2)]["data_offsets"][0].get<uint64_t>() + 1000 * 16 * 2;
  });
  EXPECT_EQ(load_error(m.dir.path, load_limits()),
            m.file() + ": the n-gram table's 4 shards hold 4072 rows, but the config gives 4096");
}

TEST(Qwen4ExpLoad, StoredHashConstantsThatDisagreeWithTheConfig) {
  const std::pair<const char*, int> edits[] = {{"layer_multipliers", 1}, {"ngram_heads_vocab_sizes", 3},
                                               {"ngram_heads_offsets", 2}};
  for (const auto& [buffer, index] : edits) {
    BrokenQwen4Exp m;
    const NgramHash hash = m.hash();
    const std::string name = buffer;
    std::vector<int64_t> want = name == "layer_multipliers" ? hash.multipliers
                                : name == "ngram_heads_vocab_sizes" ? hash.sizes : hash.offsets;
    std::vector<int64_t> stored = want;
    stored[size_t(index)] += 2;
    test::overwrite_tensor_bytes(m.file(), m.table + name, 8 * size_t(index), &stored[size_t(index)], 8);
    EXPECT_EQ(load_error(m.dir.path, load_limits()),
              m.file() + ": the n-gram hash constant '" + m.table + name + "' is " + list(stored) +
                  " but the config (vocab_size, seed, ngram_vocab_size_base, heads_per_ngram) gives " + list(want));
  }
}

TEST(Qwen4ExpLoad, LayerTypesThatDoNotMatchTheLayerCount) {
  BrokenQwen4Exp m;
  const std::string good = test::read_text(m.dir / "config.json");
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(good);
  config["text_config"]["layer_types"].erase(7);
  test::write_text(m.dir / "config.json", config.dump(2));
  EXPECT_EQ(load_error(m.dir.path, load_limits()),
            m.dir / "config.json" + ": field 'layer_types' lists 7 layers but num_hidden_layers is 8");
  config = nlohmann::ordered_json::parse(good);
  config["text_config"]["num_hidden_layers"] = 9;
  test::write_text(m.dir / "config.json", config.dump(2));
  EXPECT_EQ(load_error(m.dir.path, load_limits()),
            m.dir / "config.json" + ": field 'layer_types' lists 8 layers but num_hidden_layers is 9");
}

// An FP8 table: its scale missing or not a finite positive value, its shards of mixed dtypes.
TEST(Qwen4ExpLoad, Fp8TableScaleAndShardDtypes) {
  {
    BrokenQwen4Exp m("fp8");
    const std::string scale = m.table + "ngram_embedding.weight_scale";
    m.edit_header([&](nlohmann::ordered_json& h) {
      h[m.table + "ngram_embedding.weight_scalX"] = h[scale];
      h.erase(scale);
    });
    EXPECT_EQ(load_error(m.dir.path, load_limits()), m.file() + ": the n-gram table's shards are F8_E4M3 but its scale '" +
                                          scale + "' is missing");
  }
  for (float bad : {0.0f, -1.0f, NAN}) {
    BrokenQwen4Exp m("fp8");
    const std::string scale = m.table + "ngram_embedding.weight_scale";
    test::overwrite_tensor_bytes(m.file(), scale, 0, &bad, sizeof bad);
    EXPECT_EQ(load_error(m.dir.path, load_limits()), m.file() + ": the n-gram table's scale '" + scale + "' is " +
                                          std::to_string(bad) + ": it must be finite and positive");
  }
  {
    BrokenQwen4Exp m("fp8");
    m.edit_header([&](nlohmann::ordered_json& h) {  // the same bytes read as BF16
      h[m.shard(1)]["dtype"] = "BF16";
      h[m.shard(1)]["shape"] = {512, 16};
    });
    EXPECT_EQ(load_error(m.dir.path, load_limits()),
              m.file() + ": n-gram table shard '" + m.shard(1) + "' is BF16 but shard 0 is F8_E4M3");
  }
  {  // a matrix the forward keeps in FP32, widened from FP8 at load: no NaN code
    BrokenQwen4Exp m("fp8");
    const std::string mix = "model.language_model.layers.2.attn_hyper_connection.input_mix_weight_down.weight";
    const uint8_t nan = 0x7f;
    test::overwrite_tensor_bytes(m.file(), mix, 256 + 3, &nan, 1);
    EXPECT_EQ(load_error(m.dir.path, load_limits()), m.file() + ": tensor '" + mix + "' holds an FP8 NaN at [1, 3]");
  }
}

TEST(Qwen4ExpLoad, FusedFp8ExpertsAreRefused) {
  BrokenQwen4Exp m;
  const std::string fused = "model.language_model.layers.0.mlp.experts.gate_up_proj";
  m.edit_header([&](nlohmann::ordered_json& h) {  // the same bytes read as E4M3
    h.erase("__metadata__");  // room for the longer dtype
    h[fused]["dtype"] = "F8_E4M3";
    h[fused]["shape"] = {8, 128, 64};
  });
  EXPECT_EQ(load_error(m.dir.path, load_limits()), m.file() + ": '" + fused + "' is F8_E4M3: FP8 experts are read one tensor "
                                                "each (experts.N.gate_proj.weight ...), as Qwen's FP8 "
                                                "checkpoints store them, not fused");
}

TEST(ModelForward, RejectsTokensOutsideTheVocabularyAndPositionsBeyondTheSequence) {
  test::ScratchDir dir;
  ModelConfig config = test::small_dense_config();
  test::write_checkpoint(dir.path, config, checkpoint_tensors(config));
  auto model = Model::load(dir.path, load_limits());
  std::vector<float> logits(size_t(model->vocab_size()));
  std::vector<BatchToken> bad_token = {{512, 0, 0, true}};
  EXPECT_EQ(error_of([&] { model->forward(bad_token, logits.data()); }),
            "forward: token id 512 is outside the vocabulary (512 ids)");
  std::vector<BatchToken> negative = {{-1, 0, 0, true}};
  EXPECT_NE(error_of([&] { model->forward(negative, logits.data()); }), "");
  std::vector<BatchToken> too_far = {{5, 0, 16, true}};
  EXPECT_EQ(error_of([&] { model->forward(too_far, logits.data()); }),
            "forward: position 16 is beyond the sequence length 16");
  std::vector<BatchToken> too_many(18, BatchToken{1, 0, 0, false});
  for (int i = 0; i < 18; ++i) too_many[i].position = i;
  EXPECT_NE(error_of([&] { model->forward(too_many, logits.data()); }).find("18 tokens in one pass"),
            std::string::npos);
  std::vector<BatchToken> bad_slot = {{5, 1, 0, true}};
  EXPECT_EQ(error_of([&] { model->forward(bad_slot, logits.data()); }),
            "forward: slot 1 does not exist (batch size 1)");
}

}  // namespace
}  // namespace ellm
