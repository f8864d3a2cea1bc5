// The vision tower (src/model/vision/): the golden rows of tiny-qwen35-vl from the golden pixel
// values on every tier, a folder without a tower, and the errors of a bad vision_config or
// checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/cpu.h"
#include "base/error.h"
#include "base/threads.h"
#include "model/vision/vision_config.h"
#include "model/vision/vision_tower.h"
#include "model_test_util.h"
#include "tiers_under_test.h"

namespace ellm {
namespace {

using nlohmann::json;
using test::read_binary;
using test::read_text;
using test::shared_dir;
using test::shared_model;

const std::string kGolden = shared_dir() + "/golden/tiny-qwen35-vl";

double relative_frobenius(const std::vector<float>& engine, const std::vector<float>& golden) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < golden.size(); ++i) {
    diff += (double(engine[i]) - golden[i]) * (double(engine[i]) - golden[i]);
    norm += double(golden[i]) * golden[i];
  }
  return std::sqrt(diff / norm);
}

// Restores the tier that was active before the test.
class VisionTowerGolden : public testing::Test {
 protected:
  void SetUp() override { isa_ = active_isa(); }
  void TearDown() override { set_active_isa(isa_); }

 private:
  Isa isa_ = Isa::scalar;
};

TEST_F(VisionTowerGolden, RowsFromGoldenPixelsWithinToleranceOnEveryTier) {
  const json session = json::parse(read_text(kGolden + "/session.json"));
  const double tol = session["vision_rows_rel_tol"];
  ThreadTeam team(2);
  for (Isa isa : test::tiers_under_test()) {
    set_active_isa(isa);
    auto tower = VisionTower::load_if_present(shared_model("tiny-qwen35-vl"), team, isa);
    ASSERT_TRUE(tower);
    ASSERT_EQ(tower->out_hidden(), 128);
    for (const json& image : session["images"]) {
      const auto grid = image["grid_thw"].get<std::vector<int64_t>>();
      const std::vector<float> pixels = read_binary<float>(kGolden + "/" + image["pixel_values"].get<std::string>());
      const std::vector<float> golden = read_binary<float>(kGolden + "/" + image["vision_rows"].get<std::string>());
      const int64_t tokens = tower->tokens(grid[0], grid[1], grid[2]);
      ASSERT_EQ(tokens, image["n_tokens"].get<int64_t>());
      ASSERT_EQ(int64_t(pixels.size()), grid[0] * grid[1] * grid[2] * tower->config().patch_values());
      ASSERT_EQ(int64_t(golden.size()), tokens * tower->out_hidden());
      std::vector<float> rows(golden.size());
      tower->encode(pixels.data(), grid[0], grid[1], grid[2], rows.data());
      const double err = relative_frobenius(rows, golden);
      std::printf("[vision %s %s] grid %lldx%lldx%lld: relative error %.5f (tolerance %.4f)\n",
                  isa_name(isa), image["file"].get<std::string>().c_str(), (long long)grid[0],
                  (long long)grid[1], (long long)grid[2], err, tol);
      EXPECT_LE(err, tol) << isa_name(isa) << " " << image["file"];
    }
  }
}

// Every image of a batch of grids through one tower: a smaller image after a larger one gives
// the rows it gives alone (the kept scratch carries nothing over).
TEST_F(VisionTowerGolden, SmallerImageAfterLargerGivesTheSameRows) {
  const json session = json::parse(read_text(kGolden + "/session.json"));
  ThreadTeam team(2);
  auto run = [&](VisionTower& tower, const json& image) {
    const auto grid = image["grid_thw"].get<std::vector<int64_t>>();
    const std::vector<float> pixels = read_binary<float>(kGolden + "/" + image["pixel_values"].get<std::string>());
    std::vector<float> rows(size_t(tower.tokens(grid[0], grid[1], grid[2]) * tower.out_hidden()));
    tower.encode(pixels.data(), grid[0], grid[1], grid[2], rows.data());
    return rows;
  };
  auto fresh = VisionTower::load_if_present(shared_model("tiny-qwen35-vl"), team);
  const std::vector<float> alone = run(*fresh, session["images"][2]);
  auto used = VisionTower::load_if_present(shared_model("tiny-qwen35-vl"), team);
  run(*used, session["images"][0]);
  EXPECT_EQ(run(*used, session["images"][2]), alone);
}

TEST(VisionTower, FolderWithoutTowerHasNone) {
  ThreadTeam team(1);
  EXPECT_EQ(VisionTower::load_if_present(shared_model("tiny-qwen3"), team), nullptr);
  // language_model_only: the tower's tensors may be there, they are not read.
  test::ScratchDir dir;
  const std::string source = shared_model("tiny-qwen35-vl");
  std::filesystem::create_symlink(source + "/model.safetensors", dir / "model.safetensors");
  json config = json::parse(read_text(source + "/config.json"));
  config["language_model_only"] = true;
  test::write_text(dir / "config.json", config.dump());
  EXPECT_EQ(VisionTower::load_if_present(dir.path, team), nullptr);
}

// The other Qwen3.5-generation tiny models carry a one-block tower of their own shape.
TEST(VisionTower, EveryTinyQwen35GenerationTowerLoadsAndEncodes) {
  ThreadTeam team(2);
  for (const char* name : {"tiny-qwen35", "tiny-qwen35-moe", "tiny-qwen4exp"}) {
    auto tower = VisionTower::load_if_present(shared_model(name), team);
    ASSERT_TRUE(tower) << name;
    const int64_t grid_h = 4, grid_w = 6, patches = grid_h * grid_w;
    std::vector<float> pixels(size_t(patches * tower->config().patch_values()));
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = float(i % 251) / 125.0f - 1.0f;
    std::vector<float> rows(size_t(tower->tokens(1, grid_h, grid_w) * tower->out_hidden()), NAN);
    tower->encode(pixels.data(), 1, grid_h, grid_w, rows.data());
    EXPECT_EQ(tower->tokens(1, grid_h, grid_w), 6) << name;
    for (float v : rows) ASSERT_TRUE(std::isfinite(v)) << name;
  }
}

// The message of parse_vision_config on tiny-qwen35-vl's config with vision_config edited.
std::string config_error(const std::function<void(json&)>& edit) {
  json config = json::parse(read_text(shared_model("tiny-qwen35-vl") + "/config.json"));
  edit(config["vision_config"]);
  try {
    parse_vision_config(config, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(VisionTower, BadVisionConfigNamesTheField) {
  EXPECT_NE(config_error([](json& v) { v["hidden_size"] = 33; }).find("not divisible by num_heads"),
            std::string::npos);
  EXPECT_NE(config_error([](json& v) { v.erase("depth"); }).find("missing field 'depth'"),
            std::string::npos);
  EXPECT_NE(config_error([](json& v) { v["num_position_embeddings"] = 60; }).find("not a square"),
            std::string::npos);
  EXPECT_NE(config_error([](json& v) { v["hidden_act"] = "relu"; }).find("hidden_act 'relu'"),
            std::string::npos);
  EXPECT_NE(config_error([](json& v) { v["deepstack_visual_indexes"] = {1}; }).find("deepstack"),
            std::string::npos);
  EXPECT_NE(config_error([](json& v) { v["num_heads"] = 0; }).find("num_heads"), std::string::npos);
}

// The message of loading the tower of tiny-qwen35-vl's checkpoint under an edited vision_config.
std::string load_error(const std::function<void(json&)>& edit) {
  test::ScratchDir dir;
  const std::string source = shared_model("tiny-qwen35-vl");
  std::filesystem::create_symlink(source + "/model.safetensors", dir / "model.safetensors");
  json config = json::parse(read_text(source + "/config.json"));
  edit(config["vision_config"]);
  test::write_text(dir / "config.json", config.dump());
  ThreadTeam team(1);
  try {
    VisionTower::load_if_present(dir.path, team);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(VisionTower, CheckpointNotMatchingTheConfigNamesTheTensor) {
  EXPECT_NE(load_error([](json& v) { v["depth"] = 3; }).find("missing tensor 'model.visual.blocks.2."),
            std::string::npos);
  EXPECT_NE(load_error([](json& v) { v["out_hidden_size"] = 64; })
                .find("'model.visual.merger.linear_fc2.weight' has shape [128, 128], expected [64, 128]"),
            std::string::npos);
  EXPECT_NE(load_error([](json& v) { v["intermediate_size"] = 96; }).find("model.visual.blocks.0.mlp.linear_fc1.weight"),
            std::string::npos);
}

TEST(VisionTower, GridOfPartialMergeBlocksIsAnError) {
  ThreadTeam team(1);
  auto tower = VisionTower::load_if_present(shared_model("tiny-qwen35-vl"), team);
  ASSERT_TRUE(tower);
  std::vector<float> pixels(size_t(3 * 4 * tower->config().patch_values())), out(1000);
  EXPECT_THROW(tower->encode(pixels.data(), 1, 3, 4, out.data()), Error);
  EXPECT_THROW(tower->encode(pixels.data(), 0, 4, 4, out.data()), Error);
}

}  // namespace
}  // namespace ellm
