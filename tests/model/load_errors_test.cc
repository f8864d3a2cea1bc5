// Bad model folders and bad inputs: each gives one line naming the file and the problem.
#include <gtest/gtest.h>

#include <filesystem>

#include "model/config.h"
#include "tools/hf_config.h"
#include "tools/make_model.h"
#include "model/model.h"
#include "model_test_util.h"

namespace ellm {
namespace {

using test::error_of;

ServingLimits limits() {
  ServingLimits l;
  l.sequence_length = 16;
  l.chunk_size = 16;
  l.threads = 1;
  return l;
}

std::string load_error(const std::string& dir) {
  std::string message = error_of([&] { Model::load(dir, limits()); });
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  return message;
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
    auto model = Model::load(dir.path, limits());
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
  EXPECT_EQ(load_error(dir.path).rfind(dir / "config.json" + ": cannot open", 0), 0u);
}

TEST(ModelLoad, UnknownArchitecture) {
  test::ScratchDir dir;
  ModelConfig config = test::small_dense_config();
  test::write_checkpoint(dir.path, config, checkpoint_tensors(config));
  std::string text = test::read_text(dir / "config.json");
  text.replace(text.find("Qwen3ForCausalLM"), 16, "MistralForCausalLM");
  test::write_text(dir / "config.json", text);
  EXPECT_EQ(load_error(dir.path), dir / "config.json" +
                                      ": unsupported architecture 'MistralForCausalLM' (expected "
                                      "Qwen3ForCausalLM or Qwen3MoeForCausalLM)");
}

TEST(ModelLoad, MissingTensor) {
  test::ScratchDir dir;
  ModelConfig config = test::small_dense_config();
  test::write_checkpoint(dir.path, config,
                         without(checkpoint_tensors(config), "model.layers.1.mlp.up_proj.weight"));
  EXPECT_EQ(load_error(dir.path),
            dir / "model.safetensors" + ": missing tensor 'model.layers.1.mlp.up_proj.weight'");
}

TEST(ModelLoad, WrongShape) {
  test::ScratchDir dir;
  ModelConfig config = test::small_dense_config();
  std::vector<TensorSpec> specs = checkpoint_tensors(config);
  for (TensorSpec& s : specs)
    if (s.name == "model.layers.0.self_attn.k_proj.weight") s.shape = {32, 64};
  test::write_checkpoint(dir.path, config, specs);
  EXPECT_EQ(load_error(dir.path),
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
  EXPECT_EQ(load_error(dir.path), dir / "model.safetensors" +
                                      ": tensor 'model.embed_tokens.weight' has dtype I16, "
                                      "expected BF16, F16 or F32");
}

TEST(ModelLoad, TruncatedAndCorruptHeaders) {
  test::ScratchDir dir;
  ModelConfig config = test::small_dense_config();
  test::write_checkpoint(dir.path, config, checkpoint_tensors(config));
  std::string bytes = test::read_text(dir / "model.safetensors");
  test::write_text(dir / "model.safetensors", bytes.substr(0, 200));
  EXPECT_EQ(load_error(dir.path).rfind(dir / "model.safetensors" + ": header length", 0), 0u);
  bytes[20] = '\x01';
  test::write_text(dir / "model.safetensors", bytes);
  EXPECT_EQ(load_error(dir.path),
            dir / "model.safetensors" + ": corrupt safetensors header (not valid JSON)");
}

TEST(ModelLoad, IndexPointingAtMissingShard) {
  test::ScratchDir dir;
  write_random_model(test::small_dense_config(), dir.path, 1, 2);
  std::filesystem::remove(dir / "model-00002-of-00002.safetensors");
  EXPECT_EQ(load_error(dir.path), dir / "model.safetensors.index.json" +
                                      ": shard 'model-00002-of-00002.safetensors' does not exist");
}

TEST(ModelLoad, MissingExpertTensor) {
  test::ScratchDir dir;
  ModelConfig config = test::small_moe_config();
  test::write_checkpoint(
      dir.path, config,
      without(checkpoint_tensors(config), "model.layers.2.mlp.experts.5.down_proj.weight"));
  EXPECT_EQ(load_error(dir.path), dir / "model.safetensors" +
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
    EXPECT_EQ(load_error(dir.path), dir / "model.safetensors" +
                                        ": layer 0 has more experts than num_experts = 6 in "
                                        "config.json");
  }
  {  // config.json says 8, the checkpoint has 6
    test::ScratchDir dir;
    test::write_checkpoint(dir.path, config, checkpoint_tensors(fewer));
    EXPECT_EQ(load_error(dir.path), dir / "model.safetensors" +
                                        ": tensor 'model.layers.0.mlp.gate.weight' has shape "
                                        "[6, 64], expected [8, 64] from config.json");
  }
}

TEST(ModelForward, RejectsTokensOutsideTheVocabularyAndPositionsBeyondTheSequence) {
  test::ScratchDir dir;
  ModelConfig config = test::small_dense_config();
  test::write_checkpoint(dir.path, config, checkpoint_tensors(config));
  auto model = Model::load(dir.path, limits());
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
