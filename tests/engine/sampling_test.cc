#include "engine/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <numeric>

namespace ellm {
namespace {

// Logits whose softmax is exactly `probs`.
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(float(std::log(p)));
  return logits;
}

// Empirical frequency of each id over n draws.
std::vector<double> frequencies(Sampler& sampler, const std::vector<float>& logits, int n) {
  std::vector<double> freq(logits.size(), 0.0);
  for (int i = 0; i < n; ++i) freq[sampler.sample(logits)] += 1.0 / n;
  return freq;
}

SamplingParams params_with(float temperature, int top_k = 0, float top_p = 1, float min_p = 0,
                           uint64_t seed = 1234) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  return p;
}

TEST(Sampling, ArgmaxPrefersLowestIdOnTiesAndSkipsNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> logits = {1.0f, 3.0f, nan, 3.0f, -2.0f};
  EXPECT_EQ(argmax(logits), 1);
  std::vector<float> with_nan_first = {nan, -1.0f, 0.5f};
  EXPECT_EQ(argmax(with_nan_first), 2);
}

TEST(Sampling, ZeroTemperatureIsGreedy) {
  Sampler sampler(5, 16);
  sampler.start(params_with(0.0f), {});
  std::vector<float> logits = {0.1f, 0.2f, 4.0f, 3.9f, -1.0f};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sampler.sample(logits), 2);
}

TEST(Sampling, DrawsFollowTheSoftmax) {
  const std::vector<double> probs = {0.5, 0.25, 0.15, 0.1};
  Sampler sampler(4, 16);
  sampler.start(params_with(1.0f), {});
  auto freq = frequencies(sampler, logits_of(probs), 40000);
  for (size_t i = 0; i < probs.size(); ++i) EXPECT_NEAR(freq[i], probs[i], 0.015) << "id " << i;
}

TEST(Sampling, TemperatureSharpensTheDistribution) {
  const std::vector<double> probs = {0.5, 0.25, 0.15, 0.1};
  Sampler sampler(4, 16);
  sampler.start(params_with(0.5f), {});
  auto freq = frequencies(sampler, logits_of(probs), 40000);
  // softmax(log p / 0.5) = p^2 / sum p^2
  double z = 0;
  for (double p : probs) z += p * p;
  for (size_t i = 0; i < probs.size(); ++i) EXPECT_NEAR(freq[i], probs[i] * probs[i] / z, 0.015);
}

TEST(Sampling, TopKKeepsOnlyTheKMostLikely) {
  const std::vector<double> probs = {0.1, 0.4, 0.05, 0.3, 0.15};
  Sampler sampler(5, 16);
  sampler.start(params_with(1.0f, /*top_k=*/2), {});
  auto freq = frequencies(sampler, logits_of(probs), 20000);
  EXPECT_NEAR(freq[1], 0.4 / 0.7, 0.02);
  EXPECT_NEAR(freq[3], 0.3 / 0.7, 0.02);
  EXPECT_EQ(freq[0] + freq[2] + freq[4], 0.0);
}

TEST(Sampling, TopPKeepsTheSmallestSetReachingP) {
  const std::vector<double> probs = {0.15, 0.5, 0.05, 0.3};
  Sampler sampler(4, 16);
  sampler.start(params_with(1.0f, 0, /*top_p=*/0.7f), {});
  auto freq = frequencies(sampler, logits_of(probs), 20000);
  EXPECT_NEAR(freq[1], 0.5 / 0.8, 0.02);
  EXPECT_NEAR(freq[3], 0.3 / 0.8, 0.02);
  EXPECT_EQ(freq[0] + freq[2], 0.0);

  sampler.start(params_with(1.0f, 0, 0.85f), {});
  freq = frequencies(sampler, logits_of(probs), 20000);
  EXPECT_GT(freq[0], 0.1);
  EXPECT_EQ(freq[2], 0.0);
}

TEST(Sampling, MinPDropsTokensFarBelowTheBest) {
  const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  Sampler sampler(4, 16);
  sampler.start(params_with(1.0f, 0, 1.0f, /*min_p=*/0.2f), {});  // keeps p >= 0.1
  auto freq = frequencies(sampler, logits_of(probs), 20000);
  EXPECT_NEAR(freq[0], 0.5 / 0.95, 0.02);
  EXPECT_NEAR(freq[2], 0.15 / 0.95, 0.02);
  EXPECT_EQ(freq[3], 0.0);
}

TEST(Sampling, TopKThenTopPOverTheRenormalisedTopK) {
  // top_k=3 leaves {0.4, 0.3, 0.2} -> renormalised {0.44, 0.33, 0.22}; top_p 0.7 keeps two.
  const std::vector<double> probs = {0.05, 0.4, 0.2, 0.3, 0.05};
  Sampler sampler(5, 16);
  sampler.start(params_with(1.0f, 3, 0.7f), {});
  auto freq = frequencies(sampler, logits_of(probs), 20000);
  EXPECT_NEAR(freq[1] + freq[3], 1.0, 1e-9);
  EXPECT_GT(freq[3], 0.3);
}

TEST(Sampling, SeedMakesDrawsReproducible) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(std::sin(double(i)));
  auto draw = [&](uint64_t seed) {
    Sampler sampler(int64_t(logits.size()), 64);
    sampler.start(params_with(1.0f, 50, 0.9f, 0.0f, seed), {});
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) ids.push_back(sampler.sample(logits));
    return ids;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampling, RepetitionPenaltyFollowsHuggingFace) {
  std::vector<float> logits = {2.0f, -1.0f, 3.0f, 0.5f};
  std::vector<int32_t> context = {0, 1};
  apply_repetition_penalty(logits, context, 2.0f);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);   // positive: divided
  EXPECT_FLOAT_EQ(logits[1], -2.0f);  // negative: multiplied
  EXPECT_FLOAT_EQ(logits[2], 3.0f);
  EXPECT_FLOAT_EQ(logits[3], 0.5f);
}

TEST(Sampling, PresenceAndFrequencyFollowOpenAI) {
  std::vector<float> logits = {1.0f, 1.0f, 1.0f};
  std::vector<int32_t> counts = {3, 0, 1};
  std::vector<int32_t> generated = {0, 2};
  apply_presence_frequency(logits, generated, counts, 0.5f, 0.25f);
  EXPECT_FLOAT_EQ(logits[0], 1.0f - 3 * 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(logits[1], 1.0f);
  EXPECT_FLOAT_EQ(logits[2], 1.0f - 0.25f - 0.5f);
}

TEST(Sampling, SamplerPenalisesPromptAndGeneratedTokens) {
  std::vector<float> logits = {2.0f, 1.9f, 1.8f, 0.0f};
  SamplingParams p = params_with(0.0f);
  p.presence_penalty = 0.25f;
  Sampler sampler(4, 16);
  sampler.start(p, {});
  // Greedy with a presence penalty walks through the near-tied ids instead of repeating.
  std::vector<int32_t> got;
  for (int i = 0; i < 3; ++i) {
    got.push_back(sampler.sample(logits));
    sampler.accept(got.back());
  }
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2}));

  // Repetition penalty counts the prompt; restarting clears the previous request's counts.
  p = params_with(0.0f);
  p.repetition_penalty = 1.2f;
  const int32_t prompt[] = {0};
  sampler.start(p, prompt);
  EXPECT_EQ(sampler.sample(logits), 1);  // 2.0 / 1.2 < 1.9
  p.repetition_penalty = 1.0f;
  sampler.start(p, prompt);
  EXPECT_EQ(sampler.sample(logits), 0);
}

TEST(Sampling, RawLogprobsAreTheLogSoftmaxOfTheUnprocessedLogits) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f};
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  std::vector<int32_t> scratch(logits.size());
  TokenLogprob out;
  raw_logprobs(logits, 3, 2, scratch, out);
  EXPECT_EQ(out.id, 3);
  EXPECT_NEAR(out.logprob, 1.0 - std::log(z), 1e-5);
  ASSERT_EQ(out.top.size(), 2u);
  EXPECT_EQ(out.top[0].first, 1);
  EXPECT_NEAR(out.top[0].second, 2.0 - std::log(z), 1e-5);
  EXPECT_EQ(out.top[1].first, 3);

  // The penalties do not change the reported logprobs.
  SamplingParams p = params_with(0.0f);
  p.frequency_penalty = 5.0f;
  p.top_logprobs = 1;
  Sampler sampler(4, 16);
  sampler.start(p, {});
  sampler.accept(1);
  EXPECT_EQ(sampler.sample(logits), 3);
  sampler.logprobs(logits, 3, out);
  EXPECT_NEAR(out.logprob, 1.0 - std::log(z), 1e-5);
  EXPECT_EQ(out.top[0].first, 1);
}

TEST(Sampling, FullVocabularyTopPIsCorrectWhenTheMassIsSpread) {
  // Nearly flat logits: top_p 0.95 needs far more than the first few thousand ids.
  const int64_t vocab = 151936;
  std::vector<float> logits(vocab);
  for (int64_t i = 0; i < vocab; ++i) logits[i] = float(i % 97) * 1e-3f;
  Sampler sampler(vocab, 256);
  sampler.start(params_with(1.0f, 0, 0.95f), {});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 200; ++i) {
    int32_t id = sampler.sample(logits);
    ASSERT_GE(id, 0);
    ASSERT_LT(id, vocab);
    ++seen[id % 97];
  }
  // Only the lowest residues are cut: roughly 5% of the mass.
  EXPECT_EQ(seen.count(0), 0u);
  EXPECT_GT(seen.size(), 50u);
}

TEST(Sampling, HostileValuesNeverCrash) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<std::vector<float>> rows = {
      {nan, nan, nan}, {-inf, -inf, -inf}, {inf, 1.0f, inf}, {nan, 2.0f, -inf}};
  for (float temperature : {nan, -1.0f, 0.0f, 1e-30f, 1.0f, 1e30f, inf}) {
    for (auto& row : rows) {
      SamplingParams p = params_with(temperature, 2, nan, nan);
      p.repetition_penalty = nan;
      p.presence_penalty = inf;
      Sampler sampler(3, 4);
      sampler.start(p, std::vector<int32_t>{0, 1});
      int32_t id = sampler.sample(row);
      EXPECT_GE(id, 0);
      EXPECT_LT(id, 3);
    }
  }
}

// The model's vocabulary (151,936 rows) is larger than the tokenizer's (151,669 tokens): every
// buffer must hold the model's, and the last ids must be usable everywhere. Under ASan (CI) any
// write past a scratch buffer fails this test.
TEST(Sampling, EveryPathStaysInsideAPaddedVocabulary) {
  const int64_t vocab = 151936;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> logits(vocab);
  for (int64_t i = 0; i < vocab; ++i) logits[i] = float((i * 7919) % 1013) * 1e-2f;
  for (int64_t i = 1000; i < 1100; ++i) logits[i] = nan;          // a block of NaNs
  for (int64_t i = 5000; i < 9000; ++i) logits[i] = 3.0f;          // a wide tie
  logits[vocab - 1] = 20.0f;                                       // the last id is the favourite
  const std::vector<int32_t> prompt = {0, 1, int32_t(vocab - 2), int32_t(vocab - 1)};
  for (int top_k : {0, 1, 50, int(vocab) - 1, int(vocab)}) {
    for (float top_p : {1.0f, 0.9f, 1e-6f}) {
      for (float min_p : {0.0f, 0.05f, 1.0f}) {
        SamplingParams p = params_with(0.8f, top_k, top_p, min_p);
        p.seed = 7;
        p.repetition_penalty = 1.3f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.5f;
        p.top_logprobs = 20;
        Sampler sampler(vocab, 8);
        sampler.start(p, prompt);
        for (int step = 0; step < 3; ++step) {
          int32_t id = sampler.sample(logits);
          ASSERT_GE(id, 0);
          ASSERT_LT(id, vocab);
          TokenLogprob lp;
          sampler.logprobs(logits, id, lp);
          ASSERT_EQ(lp.top.size(), 20u);
          EXPECT_EQ(lp.top[0].first, vocab - 1);
          sampler.accept(id);
          sampler.accept(int32_t(vocab - 1));
        }
      }
    }
  }
}

// Speculative decoding's rejection rule: whatever a proposer offers, the token that comes out
// is distributed exactly as without a proposal (the filtered distribution), and a greedy
// request takes the argmax whatever was proposed.
TEST(Sampling, ProposalsLeaveTheDistributionAsItIs) {
  const std::vector<double> probs = {0.35, 0.05, 0.25, 0.2, 0.15};
  const std::vector<float> logits = logits_of(probs);
  struct Case {
    int top_k;
    std::vector<double> expected;  // the filtered distribution
  };
  const Case cases[] = {{0, probs}, {3, {0.35 / 0.8, 0, 0.25 / 0.8, 0.2 / 0.8, 0}}};
  for (const Case& c : cases) {
    for (int32_t proposal : {0, 1, 3, 4}) {  // the best, unlikely ones, one top-k cuts
      Sampler sampler(5, 16);
      sampler.start(params_with(1.0f, c.top_k, 1.0f, 0.0f, 99 + proposal), {});
      std::vector<double> freq(5, 0.0);
      const int n = 100000;
      for (int i = 0; i < n; ++i) freq[sampler.sample(logits, proposal)] += 1.0 / n;
      for (size_t id = 0; id < 5; ++id)
        EXPECT_NEAR(freq[id], c.expected[id], 0.006) << "top_k " << c.top_k << ", proposal " << proposal << ", id " << id;
    }
  }
  Sampler greedy_sampler(5, 16);
  greedy_sampler.start(params_with(0.0f), {});
  for (int32_t proposal : {0, 1, 2}) EXPECT_EQ(greedy_sampler.sample(logits, proposal), 0);
}

}  // namespace
}  // namespace ellm
