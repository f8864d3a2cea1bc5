// Images in the Qwen3.5 decoder against shared/golden/tiny-qwen35-vl: the 3-D rope positions
// (exact), the multimodal rotary angles, and the teacher-forced session with the golden tower rows
// in place of the <|image_pad|> embeddings, on every tier. The tower and the preprocessing have
// their own tests; here their golden outputs stand in for them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "base/cpu.h"
#include "model/config.h"
#include "model/model.h"
#include "model/rope.h"
#include "golden_util.h"
#include "model_test_util.h"
#include "tiers_under_test.h"

namespace ellm {
namespace {

using test::Golden;
using test::read_binary;
using test::shared_dir;
using test::shared_model;

const char* kName = "tiny-qwen35-vl";

struct GoldenImage {
  ImagePlacement place;
  std::vector<float> rows;  // [n_tokens][hidden]
};

std::vector<GoldenImage> golden_images(const Golden& g) {
  std::vector<GoldenImage> out;
  for (const auto& image : g.session["images"]) {
    GoldenImage i;
    i.place = {image["first_token_index"].get<int64_t>(), image["merged_grid_hw"][0].get<int64_t>(),
               image["merged_grid_hw"][1].get<int64_t>()};
    i.rows = read_binary<float>(shared_dir() + "/golden/" + kName + "/" + image["vision_rows"].get<std::string>());
    out.push_back(std::move(i));
  }
  return out;
}

std::vector<ImagePlacement> placements(const std::vector<GoldenImage>& images) {
  std::vector<ImagePlacement> out;
  for (const auto& i : images) out.push_back(i.place);
  return out;
}

TEST(Qwen35Vision, RopePositionsAreTheReferences) {
  Golden g(kName);
  const auto images = placements(golden_images(g));
  const auto positions = read_binary<int32_t>(shared_dir() + "/golden/" + kName + "/session_positions.i32");
  ASSERT_EQ(int64_t(positions.size()), 3 * g.positions);
  for (int64_t p = 0; p < g.positions; ++p) {
    const auto thw = rope_position(images, p);
    for (int axis = 0; axis < 3; ++axis)
      ASSERT_EQ(thw[axis], positions[axis * g.positions + p]) << "position " << p << " axis " << axis;
  }
  // After the last image every token runs rope_delta from its index, as the reference says.
  const int64_t delta = g.session["rope_delta_after_feed"].back();
  EXPECT_EQ(rope_position(images, 1000)[0], 1000 + delta);
  // No images: the text position on all three axes, and a token keeps rope[] unset.
  EXPECT_EQ(rope_position({}, 57), (std::array<int32_t, 3>{57, 57, 57}));
  BatchToken before{1, 0, 59, true};
  set_rope_position(before, images);
  EXPECT_LT(before.rope[0], 0);
}

TEST(Qwen35Vision, RotaryAnglesAreTheReferences) {
  Golden g(kName);
  const ModelConfig config = load_model_config(shared_model(kName));
  const RopeTable table = rope_table(config);
  const std::string rows = g.session["rope"]["frequency_rows"];
  ASSERT_EQ(table.axis.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ("THW"[table.axis[i]], rows[i]) << i;

  const auto images = placements(golden_images(g));
  const auto angles = read_binary<float>(shared_dir() + "/golden/" + kName + "/session_rope_angles.f32");
  const int64_t half = int64_t(rows.size());
  ASSERT_EQ(int64_t(angles.size()), g.positions * half);
  std::vector<float> cos(half), sin(half);
  double worst = 0;
  for (int64_t p = 0; p < g.positions; ++p) {
    BatchToken t{1, 0, int32_t(p), true};
    set_rope_position(t, images);
    token_rope_angles(t, table, cos.data(), sin.data());
    for (int64_t i = 0; i < half; ++i) {
      const double angle = angles[p * half + i], bound = 1e-4 * std::max(1.0, std::abs(angle));
      worst = std::max({worst, std::abs(cos[i] - std::cos(angle)) / bound, std::abs(sin[i] - std::sin(angle)) / bound});
    }
  }
  std::printf("[%s] rotary cos/sin: worst error %.3f of the bound\n", kName, worst);
  EXPECT_LE(worst, 1.0);
}

// Feeds the golden chunks into slot 0, each image's rows in place of its pads' embeddings and
// every token at its rope position; returns [positions][vocab] logits.
std::vector<float> run_session(Model& model, const Golden& g, const std::vector<GoldenImage>& images,
                               const std::vector<std::vector<int32_t>>& feeds) {
  const auto places = placements(images);
  const int64_t V = model.vocab_size(), H = model.config().hidden_size;
  std::vector<float> logits;
  int32_t position = 0;
  for (const auto& chunk : feeds) {
    std::vector<BatchToken> batch;
    for (int32_t id : chunk) {
      BatchToken t{id, 0, position++, true};
      set_rope_position(t, places);
      for (const auto& image : images)
        if (t.position >= image.place.first && t.position < image.place.end()) {
          EXPECT_EQ(id, g.session["image_token_id"].get<int32_t>());
          t.embedding = image.rows.data() + (t.position - image.place.first) * H;
        }
      batch.push_back(t);
    }
    const size_t at = logits.size();
    logits.resize(at + chunk.size() * size_t(V));
    model.forward(batch, logits.data() + at);
  }
  return logits;
}

class Qwen35VisionTiers : public testing::Test {
 protected:
  void SetUp() override { isa_ = active_isa(); }
  void TearDown() override { set_active_isa(isa_); }
  Isa isa_ = Isa::scalar;
};

TEST_F(Qwen35VisionTiers, SessionWithImagesPassesTheReferenceRule) {
  Golden g(kName);
  const auto images = golden_images(g);
  std::vector<int32_t> all;
  for (const auto& f : g.feeds) all.insert(all.end(), f.begin(), f.end());
  for (Isa isa : test::tiers_under_test()) {
    set_active_isa(isa);
    ServingLimits limits;
    limits.sequence_length = 256;
    limits.chunk_size = 256;
    limits.threads = 2;
    auto model = Model::load(shared_model(kName), limits);
    const std::vector<float> fed = run_session(*model, g, images, g.feeds);
    test::Score s = test::score(g, fed);
    std::printf("[golden %s %s] err p50 %.4f p90 %.4f max %.4f, %.1f%% within atol\n", kName,
                isa_name(isa), s.percentile(0.5), s.percentile(0.9), s.percentile(1.0),
                100 * s.fraction_within);
    EXPECT_GE(s.fraction_within, 0.9) << isa_name(isa);
    EXPECT_EQ(s.argmax_mismatches, 0) << isa_name(isa);

    // The whole conversation in one pass (the images' positions as one prefill gives them).
    test::Score one_shot = test::score(g, run_session(*model, g, images, {all}));
    EXPECT_GE(one_shot.fraction_within, 0.9) << isa_name(isa) << " one pass";
    EXPECT_EQ(one_shot.argmax_mismatches, 0) << isa_name(isa) << " one pass";
  }
}

// The pads' own embeddings and text positions instead (what a text-only engine computes): far
// from the reference, so the test above cannot pass without the images.
TEST(Qwen35Vision, WithoutTheImagesTheSessionFails) {
  Golden g(kName);
  ServingLimits limits;
  limits.sequence_length = 256;
  limits.threads = 2;
  auto model = Model::load(shared_model(kName), limits);
  test::Score s = test::score(g, run_session(*model, g, {}, g.feeds));
  EXPECT_LT(s.fraction_within, 0.9);
}

}  // namespace
}  // namespace ellm
