// A prompt past 64k positions, fed two ways through one slot: in one pass run in parts of 16,384
// rows (run_part, as the scheduler interleaves decode steps), and in chunks of 8,192 tokens (passes
// one after another, as a chunked prefill or a resumed session). The logits at positions across the
// prompt must agree: bit for bit on tiny-qwen3-moe, whose attention runs the same blocks of
// positions in any pass and whose experts run a part's 16,384 tokens in four tiles
// (kMoeTileTokens) and a chunk's in two; within the golden tolerance on tiny-qwen35-moe, whose
// chunked delta rule rounds by where a pass cuts its chunks. That a pass run in parts gives the pass's bits is the golden
// tests' check on every model and tier (golden_test.cc); it is not repeated here, where each
// 64k prefill costs over 20 s. On the best tier only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "base/cpu.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "golden_util.h"
#include "model_test_util.h"

namespace ellm {
namespace {

using test::shared_model;

constexpr int64_t kPositions = 65600;
const std::vector<int32_t> kSampled = {0, 1, 4095, 8191, 8192, 20000, 32767, 32768, 50001, 65535, 65536, 65599};

// Logits of the sampled positions: passes of `chunk` tokens, each run whole or in parts of
// `part_rows` rows (0: whole).
std::vector<float> sampled_logits(Model& model, const std::vector<int32_t>& prompt, int64_t chunk,
                                  int64_t part_rows) {
  model.release_kv(0, 0);
  const int64_t V = model.vocab_size();
  std::vector<float> logits(kSampled.size() * size_t(V));
  size_t row = 0;
  for (int64_t begin = 0; begin < int64_t(prompt.size()); begin += chunk) {
    const int64_t end = std::min<int64_t>(int64_t(prompt.size()), begin + chunk);
    std::vector<BatchToken> pass;
    size_t wanted = 0;
    for (int64_t p = begin; p < end; ++p) {
      const bool want = std::find(kSampled.begin(), kSampled.end(), int32_t(p)) != kSampled.end();
      pass.push_back({prompt[size_t(p)], 0, int32_t(p), want});
      wanted += want;
    }
    float* out = logits.data() + row * size_t(V);
    if (part_rows > 0) {
      model.begin_pass(pass);
      while (!model.run_part(part_rows, out)) {
      }
    } else {
      model.forward(pass, out);
    }
    row += wanted;
  }
  EXPECT_EQ(row, kSampled.size());
  return logits;
}

// The golden rule's err between two rows: the largest logit difference plus that of the lse.
double row_err(const float* a, const float* b, int64_t V) {
  auto lse = [&](const float* r) {
    const double top = *std::max_element(r, r + V);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(r[v]) - top);
    return top + std::log(sum);
  };
  double worst = 0;
  for (int64_t v = 0; v < V; ++v) worst = std::max(worst, std::abs(double(a[v]) - double(b[v])));
  return worst + std::abs(lse(a) - lse(b));
}

class LongPrompt : public testing::TestWithParam<std::string> {};

TEST_P(LongPrompt, OnePassInPartsAndChunksAgreePast64kPositions) {
  const std::string name = GetParam();
  set_active_isa(best_isa());
  ServingLimits limits;
  limits.sequence_length = kPositions;
  limits.chunk_size = kPositions;
  limits.batch_size = 1;
  limits.threads = 2;
  auto model = Model::load(shared_model(name), limits);
  const int64_t V = model->vocab_size();
  std::mt19937 rng(64);
  std::uniform_int_distribution<int32_t> token(0, int32_t(V) - 1);
  std::vector<int32_t> prompt(kPositions);
  for (int32_t& t : prompt) t = token(rng);

  const std::vector<float> one_pass = sampled_logits(*model, prompt, kPositions, 16384);
  const std::vector<float> chunks = sampled_logits(*model, prompt, 8192, 0);
  for (float x : one_pass) ASSERT_TRUE(std::isfinite(x)) << name;

  const bool hybrid = model->has_recurrent_state();
  const double atol = test::Golden(name).session["atol"];
  for (size_t i = 0; i < kSampled.size(); ++i) {
    const float* a = one_pass.data() + i * size_t(V);
    const std::string where = name + " " + isa_name(best_isa()) + " position " + std::to_string(kSampled[i]);
    const float* c = chunks.data() + i * size_t(V);
    if (hybrid)
      EXPECT_LE(row_err(a, c, V), atol) << where << ": in chunks";
    else
      ASSERT_TRUE(std::equal(a, a + V, c)) << where << ": in chunks";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, LongPrompt, testing::Values("tiny-qwen3-moe", "tiny-qwen35-moe"),
                         test::ModelTestName());

}  // namespace
}  // namespace ellm
