// make-model's vision towers (tools/vision_checkpoint.h): a Qwen3.5-generation folder written
// with a tower loads both its decoder and its tower, in BF16 and FP8 (the tower stays BF16), and
// the tower encodes; the presets' tower shapes.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "base/cpu.h"
#include "base/threads.h"
#include "model/load/safetensors.h"
#include "model/model.h"
#include "model/vision/vision_tower.h"
#include "model_test_util.h"
#include "tools/make_model.h"
#include "tools/vision_checkpoint.h"

namespace ellm {
namespace {

TEST(VisionMakeModel, WrittenTowerLoadsBesideTheDecoderAndEncodes) {
  ModelConfig config = preset_config("qwen3.5-0.8b");
  config.num_hidden_layers = 4;
  config.linear_attention = {true, true, true, false};
  config.vocab_size = 1024;
  config.hidden_size = 256;
  config.intermediate_size = 512;
  std::optional<VisionConfig> vision = preset_vision_config("qwen3.5-0.8b", config.hidden_size);
  ASSERT_TRUE(vision);
  vision->depth = 2, vision->hidden_size = 64, vision->num_heads = 4, vision->intermediate_size = 128;
  const SpecialTokenIds ids = read_special_token_ids(test::shared_dir() + "/text/qwen3");
  ThreadTeam team(2);
  for (const std::string dtype : {"bf16", "fp8"}) {
    test::ScratchDir dir;
    write_random_model(config, dir.path, 3, /*shards=*/2, ids, dtype, false, &*vision);
    const nlohmann::json written = nlohmann::json::parse(test::read_text(dir / "config.json"));
    EXPECT_EQ(written["image_token_id"], 151655) << dtype;
    EXPECT_EQ(written["vision_config"]["out_hidden_size"], 256) << dtype;
    EXPECT_TRUE(std::filesystem::exists(dir / "preprocessor_config.json")) << dtype;
    const SafetensorsStore store = SafetensorsStore::open(dir.path);
    EXPECT_EQ(store.get("model.visual.blocks.1.attn.qkv.weight").dtype, Dtype::bf16) << dtype;

    ServingLimits limits;
    limits.sequence_length = 16;
    limits.threads = 2;
    auto model = Model::load(dir.path, limits);
    std::vector<BatchToken> prompt = {{1, 0, 0, false}, {2, 0, 1, true}};
    std::vector<float> logits(size_t(model->vocab_size()), NAN);
    model->forward(prompt, logits.data());
    for (float v : logits) ASSERT_TRUE(std::isfinite(v)) << dtype;

    auto tower = VisionTower::load_if_present(dir.path, team);
    ASSERT_TRUE(tower) << dtype;
    EXPECT_EQ(tower->out_hidden(), config.hidden_size);
    const int64_t grid_h = 6, grid_w = 4;
    std::vector<float> pixels(size_t(grid_h * grid_w * tower->config().patch_values()));
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = float(i % 255) / 127.5f - 1.0f;
    std::vector<float> rows(size_t(tower->tokens(1, grid_h, grid_w) * tower->out_hidden()), NAN);
    tower->encode(pixels.data(), 1, grid_h, grid_w, rows.data());
    double energy = 0;
    for (float v : rows) {
      ASSERT_TRUE(std::isfinite(v)) << dtype;
      energy += double(v) * v;
    }
    EXPECT_GT(energy, 0) << dtype;
  }
}

// qwen3.5-0.8b's real tower on a 1280 x 720 screenshot's grid (smart_resize: 704 x 1280, 44 x 80
// patches, 880 tokens); ELLM_LARGE_TESTS=1 only (minutes on a small machine).
TEST(VisionMakeModel, RealShapeTowerEncodesAScreenshotGrid) {
  if (!std::getenv("ELLM_LARGE_TESTS")) GTEST_SKIP() << "ELLM_LARGE_TESTS=1 runs it";
  ModelConfig config = preset_config("qwen3.5-0.8b");
  config.num_hidden_layers = 4;
  config.linear_attention = {true, true, true, false};
  config.vocab_size = 1024;
  const std::optional<VisionConfig> vision = preset_vision_config("qwen3.5-0.8b", config.hidden_size);
  test::ScratchDir dir;
  write_random_model(config, dir.path, 5, 1, {}, "bf16", false, &*vision);
  ThreadTeam team(physical_core_count());
  auto tower = VisionTower::load_if_present(dir.path, team);
  ASSERT_TRUE(tower);
  const int64_t grid_h = 44, grid_w = 80;
  std::vector<float> pixels(size_t(grid_h * grid_w * tower->config().patch_values()));
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = float(i * 7 % 255) / 127.5f - 1.0f;
  std::vector<float> rows(size_t(tower->tokens(1, grid_h, grid_w) * tower->out_hidden()), NAN);
  ASSERT_EQ(tower->tokens(1, grid_h, grid_w), 880);
  const auto start = std::chrono::steady_clock::now();
  tower->encode(pixels.data(), 1, grid_h, grid_w, rows.data());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[vision qwen3.5-0.8b tower] 880 tokens from 3520 patches in %.2f s on %d threads\n",
              seconds, team.size());
  for (float v : rows) ASSERT_TRUE(std::isfinite(v));
}

TEST(VisionMakeModel, PresetTowerShapes) {
  const auto small = preset_vision_config("qwen3.5-0.8b", 1024);
  ASSERT_TRUE(small);
  EXPECT_EQ(small->depth, 12);
  EXPECT_EQ(small->hidden_size, 768);
  EXPECT_EQ(small->num_position_embeddings, 2304);
  EXPECT_EQ(small->out_hidden_size, 1024);
  const auto large = preset_vision_config("qwen3.6-27b", 5120);
  ASSERT_TRUE(large);
  // 27 blocks of 12 tensors, the patch embedding's 2, the position table, the merger's 6.
  EXPECT_EQ(vision_tensors(*large).size(), 333u);
  EXPECT_FALSE(preset_vision_config("qwen3-0.6b", 1024));
}

}  // namespace
}  // namespace ellm
