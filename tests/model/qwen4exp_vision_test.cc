// Screenshots in Qwen3.8-Flash-Next (tiny-qwen4exp, whose folder carries a vision tower): the
// tower's rows replace the pads' embeddings, the pads and the tokens after them turn at their
// multimodal rope positions, and each block key of the sparse attention turns at the rope
// position of the block's first token, which may be an image token of an earlier pass. There is
// no reference output for images on this model (the Qwen3.5 tower and rope positions have theirs,
// qwen35_vl_test.cc); these tests check that the image and its positions are used, and that the
// passes an image is fed in do not matter.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "base/cpu.h"
#include "model/model.h"
#include "model/rope.h"
#include "golden_util.h"
#include "model_test_util.h"
#include "tiers_under_test.h"

namespace ellm {
namespace {

const char kFlashNext[] = "tiny-qwen4exp";

ServingLimits flash_next_image_limits(bool language_model_only = false) {
  ServingLimits l;
  l.sequence_length = 256;
  l.chunk_size = 256;
  l.threads = 2;
  l.activations = ActivationDtype::bf16;
  l.language_model_only = language_model_only;
  return l;
}

// 30 words, a 8 x 12-patch image (4 x 6 tokens) and 60 words.
struct FlashNextImagePrompt {
  std::vector<int32_t> ids;
  ImagePlacement place{30, 4, 6};
  std::vector<float> pixels;  // [96][patch floats]
  FlashNextImagePrompt(const Model& model, const test::Golden& g, uint32_t seed) {
    std::vector<int32_t> words;
    for (const auto& f : g.feeds) words.insert(words.end(), f.begin(), f.end());
    ids.assign(words.begin(), words.begin() + 30);
    ids.insert(ids.end(), size_t(place.end() - place.first), model.image_token_id());
    ids.insert(ids.end(), words.begin() + 30, words.begin() + 90);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    pixels.resize(size_t(96 * model.image_patch_floats()));
    for (float& p : pixels) p = value(rng);
  }
};

// Feeds the prompt into slot 0 as `chunks` (lengths), the image's rows in place of its pads and
// every token at its rope position (or, with text_positions, at its index); [positions][vocab].
std::vector<float> feed_with_image(Model& model, const FlashNextImagePrompt& prompt, const std::vector<float>& rows,
                                   const std::vector<int64_t>& chunks, bool text_positions = false) {
  const int64_t V = model.vocab_size(), H = model.config().hidden_size;
  const std::vector<ImagePlacement> places = {prompt.place};
  std::vector<float> logits(prompt.ids.size() * size_t(V));
  int32_t position = 0;
  for (int64_t count : chunks) {
    std::vector<BatchToken> batch;
    for (int64_t i = 0; i < count; ++i, ++position) {
      BatchToken t{prompt.ids[size_t(position)], 0, position, true};
      if (!text_positions) set_rope_position(t, places);
      if (position >= prompt.place.first && position < prompt.place.end())
        t.embedding = rows.data() + (position - prompt.place.first) * H;
      batch.push_back(t);
    }
    model.forward(batch, logits.data() + (position - count) * V);
  }
  return logits;
}

// The largest |difference| of the logits at each position.
std::vector<double> flash_next_logit_diffs(const std::vector<float>& a, const std::vector<float>& b, int64_t V) {
  std::vector<double> out(a.size() / size_t(V), 0.0);
  for (size_t i = 0; i < a.size(); ++i) out[i / size_t(V)] = std::max(out[i / size_t(V)], double(std::abs(a[i] - b[i])));
  return out;
}

TEST(Qwen4ExpVision, TheTowerLoadsWithTheModelUnlessTextOnly) {
  auto model = Model::load(test::shared_model(kFlashNext), flash_next_image_limits());
  EXPECT_EQ(model->image_token_id(), model->config().image_token_id);
  EXPECT_GE(model->image_token_id(), 0);
  EXPECT_EQ(model->image_patch_floats(), 3 * 2 * 16 * 16);
  auto text_only = Model::load(test::shared_model(kFlashNext), flash_next_image_limits(true));
  EXPECT_EQ(text_only->image_token_id(), -1);
  std::vector<float> rows(16);
  EXPECT_THROW(text_only->encode_image(rows.data(), 1, 4, 4, rows.data()), Error);
}

// The same logits whether the image comes in one pass, in chunks of 7 (its blocks of 4 and its
// rows split across passes), or the text after it one decode step at a time; a different image,
// or the image's tokens at plain text positions, changes the logits after it.
TEST(Qwen4ExpVision, AnImageGivesTheSameLogitsInAnyPassesAndIsUsed) {
  const Isa isa = active_isa();
  test::Golden g(kFlashNext);
  const double atol = g.session["atol"];
  for (Isa tier : test::tiers_under_test()) {
    set_active_isa(tier);
    auto model = Model::load(test::shared_model(kFlashNext), flash_next_image_limits());
    const int64_t V = model->vocab_size(), H = model->config().hidden_size;
    const FlashNextImagePrompt prompt(*model, g, 7), other(*model, g, 8);
    const int64_t n = int64_t(prompt.ids.size()), tokens = prompt.place.end() - prompt.place.first;
    std::vector<float> rows(size_t(tokens * H)), other_rows(rows.size());
    model->encode_image(prompt.pixels.data(), 1, 8, 12, rows.data());
    model->encode_image(other.pixels.data(), 1, 8, 12, other_rows.data());

    const std::vector<float> at_once = feed_with_image(*model, prompt, rows, {n});
    std::vector<int64_t> sevens, steps = {50};
    for (int64_t left = n; left > 0; left -= 7) sevens.push_back(std::min<int64_t>(7, left));
    for (int64_t p = 50; p < n; ++p) steps.push_back(1);
    // The golden tests' rule for passes cut elsewhere (golden_test.cc): where a pass cuts the
    // delta rule's chunks rounds differently, and on this random model a near-tie of two blocks'
    // scores can then flip (text alone does it too, at a position before the image).
    for (const auto& [what, chunks] : {std::pair{"chunks of 7", sevens}, std::pair{"decode steps", steps}}) {
      const std::vector<double> diff = flash_next_logit_diffs(at_once, feed_with_image(*model, prompt, rows, chunks), V);
      const double worst = *std::max_element(diff.begin(), diff.end());
      const auto within = std::count_if(diff.begin(), diff.end(), [&](double e) { return e <= atol; });
      std::printf("[%s %s] at once vs %s: max |diff| %.2e, %ld of %zu positions within atol %.2f\n", kFlashNext,
                  isa_name(tier), what, worst, long(within), diff.size(), atol);
      EXPECT_GE(double(within), 0.9 * double(diff.size())) << isa_name(tier) << " " << what;
    }
    const auto moved = [&](const std::vector<float>& logits) {
      const std::vector<double> diff = flash_next_logit_diffs(at_once, logits, V);
      return *std::max_element(diff.begin() + prompt.place.first, diff.end());
    };
    const double by_image = moved(feed_with_image(*model, prompt, other_rows, {n}));
    const double by_positions = moved(feed_with_image(*model, prompt, rows, {n}, /*text_positions=*/true));
    std::printf("[%s %s] another image moves the logits after it by %.3f, text positions by %.3f\n", kFlashNext,
                isa_name(tier), by_image, by_positions);
    EXPECT_GT(by_image, 1e-2) << isa_name(tier);
    EXPECT_GT(by_positions, 1e-3) << isa_name(tier);
  }
  set_active_isa(isa);
}

}  // namespace
}  // namespace ellm
