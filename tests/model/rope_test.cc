// YaRN: the frequencies and attention factor against the formula of transformers'
// _compute_yarn_parameters, worked here independently in double (and by hand for the tiny
// models' case); the config keys and the --rope-scaling flag; the error for other rope types;
// and the flag on a folder without YaRN giving exactly the logits of the one that carries it.
#include "model/rope.h"

#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/model.h"
#include "golden_util.h"
#include "model_test_util.h"

namespace ellm {
namespace {

using test::error_of;
using test::shared_model;

// The YaRN inverse frequency of rotary pair i, from the paper's formula in double.
double yarn_inv_freq(int64_t i, int64_t dim, double theta, double factor, double low, double high) {
  const double extrapolated = std::pow(theta, -2.0 * double(i) / double(dim));
  if (low == high) high += 0.001;
  const double ramp = std::min(1.0, std::max(0.0, (double(i) - low) / (high - low)));
  return extrapolated / factor * ramp + extrapolated * (1 - ramp);
}

// low = floor(dim ln(window / (2 pi beta_fast)) / (2 ln theta)), high likewise ceil with beta_slow.
std::pair<double, double> range_by_formula(int64_t dim, double theta, double window, double fast, double slow,
                                           bool truncate) {
  double low = dim * std::log(window / (2 * M_PI * fast)) / (2 * std::log(theta));
  double high = dim * std::log(window / (2 * M_PI * slow)) / (2 * std::log(theta));
  if (truncate) low = std::floor(low), high = std::ceil(high);
  return {std::max(low, 0.0), std::min(high, double(dim - 1))};
}

void expect_table(const ModelConfig& c, double low, double high) {
  const RopeTable t = rope_table(c);
  const int64_t dim = c.rotary_dim();
  ASSERT_EQ(int64_t(t.inv_freq.size()), dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double want = yarn_inv_freq(i, dim, c.rope_theta, c.rope_scaling.factor, low, high);
    EXPECT_NEAR(t.inv_freq[i], want, 2e-6 * want) << "pair " << i;
  }
}

TEST(Yarn, TinyQwen3MatchesTheGoldenParametersAndTheHandWorkedFrequencies) {
  const ModelConfig c = load_model_config(shared_model("tiny-qwen3-yarn"));
  const nlohmann::json golden = test::Golden("tiny-qwen3-yarn").session["rope_scaling"];
  ASSERT_TRUE(c.rope_scaling.is_yarn());
  EXPECT_EQ(c.rope_scaling.factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 32);
  EXPECT_NEAR(c.rope_scaling.attention_factor, double(golden["attention_factor"]), 1e-12);
  EXPECT_NEAR(c.rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1, 1e-12);
  auto [low, high] = yarn_correction_range(c.rope_scaling, c.rotary_dim(), c.rope_theta);
  EXPECT_EQ(low, double(golden["low"]));
  EXPECT_EQ(high, double(golden["high"]));
  // 32 dims, theta 1e6, window 32: low = floor(-2.13) -> 0, high = ceil(1.885) = 2. Pair 0 keeps
  // its frequency, pair 1 is half way, pairs 2.. are divided by 4.
  const RopeTable t = rope_table(c);
  EXPECT_FLOAT_EQ(t.inv_freq[0], 1.0f);
  EXPECT_NEAR(t.inv_freq[1], 0.625 * std::pow(1e6, -1.0 / 16), 1e-7);
  for (int i = 2; i < 16; ++i) EXPECT_NEAR(t.inv_freq[i], std::pow(1e6, -i / 16.0) / 4, 1e-6 * t.inv_freq[i]);
  EXPECT_FLOAT_EQ(t.attention_factor, float(0.1 * std::log(4.0) + 1));
  expect_table(c, low, high);
  EXPECT_EQ(c.context_window(), 128);
}

TEST(Yarn, TinyQwen35ReadsRopeParametersWithPartialRotary) {
  const ModelConfig c = load_model_config(shared_model("tiny-qwen35-yarn"));
  const nlohmann::json golden = test::Golden("tiny-qwen35-yarn").session["rope_scaling"];
  ASSERT_TRUE(c.rope_scaling.is_yarn());
  EXPECT_EQ(c.rotary_dim(), int64_t(golden["rotary_dim"]));
  auto [low, high] = yarn_correction_range(c.rope_scaling, c.rotary_dim(), c.rope_theta);
  auto [want_low, want_high] = range_by_formula(16, 1e7, 32, 32, 1, true);
  EXPECT_EQ(low, want_low);
  EXPECT_EQ(high, want_high);
  EXPECT_EQ(high, double(golden["high"]));
  expect_table(c, low, high);
}

ModelConfig qwen3_with(const nlohmann::json& rope_scaling) {
  auto j = nlohmann::json::parse(test::read_text(shared_model("tiny-qwen3") + "/config.json"));
  j["rope_scaling"] = rope_scaling;
  return parse_model_config(j.dump(), "config.json");
}

TEST(Yarn, ExplicitBetasUntruncatedRangeAndMscale) {
  const ModelConfig c = qwen3_with({{"rope_type", "yarn"}, {"factor", 8.0}, {"original_max_position_embeddings", 4096},
                                    {"beta_fast", 16}, {"beta_slow", 2}, {"truncate", false},
                                    {"mscale", 1.0}, {"mscale_all_dim", 0.5}});
  const double ln8 = std::log(8.0);
  EXPECT_NEAR(c.rope_scaling.attention_factor, (0.1 * ln8 + 1) / (0.05 * ln8 + 1), 1e-12);
  auto [low, high] = yarn_correction_range(c.rope_scaling, c.rotary_dim(), c.rope_theta);
  auto [want_low, want_high] = range_by_formula(c.rotary_dim(), 1e6, 4096, 16, 2, false);
  EXPECT_DOUBLE_EQ(low, want_low);
  EXPECT_DOUBLE_EQ(high, want_high);
  EXPECT_NE(low, std::floor(low));  // fractional: not rounded
  expect_table(c, low, high);
  // An explicit attention_factor wins; a missing factor is max_position_embeddings / original.
  const ModelConfig d = qwen3_with({{"type", "yarn"}, {"original_max_position_embeddings", 10240},
                                    {"attention_factor", 0.9}});
  EXPECT_EQ(d.rope_scaling.factor, 4.0);
  EXPECT_EQ(d.rope_scaling.attention_factor, 0.9);
  const ModelConfig plain = qwen3_with({{"rope_type", "default"}});
  EXPECT_FALSE(plain.rope_scaling.is_yarn());
  EXPECT_EQ(rope_table(plain).attention_factor, 1.0f);
}

TEST(Yarn, OtherRopeTypesAreAOneLineError) {
  for (const char* type : {"longrope", "linear", "dynamic", "llama3"}) {
    const std::string e = error_of([&] { qwen3_with({{"rope_type", type}, {"factor", 2.0}}); });
    EXPECT_NE(e.find(std::string("rope type '") + type + "' is not supported (supported: default, yarn)"),
              std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  EXPECT_NE(error_of([] { qwen3_with({{"rope_type", "yarn"}, {"factor", 0.5}}); }).find("factor must be at least 1"),
            std::string::npos);
}

TEST(Yarn, FlagParsesAndRefusesBadSpecs) {
  RopeScaling s = parse_rope_scaling_flag("yarn:4", "--rope-scaling");
  EXPECT_TRUE(s.is_yarn());
  EXPECT_EQ(s.factor, 4.0);
  EXPECT_EQ(s.original_max_position_embeddings, 0);
  s = parse_rope_scaling_flag("yarn:4:32768", "--rope-scaling");
  EXPECT_EQ(s.original_max_position_embeddings, 32768);
  EXPECT_FALSE(parse_rope_scaling_flag("none", "--rope-scaling").is_yarn());
  EXPECT_NE(error_of([] { parse_rope_scaling_flag("longrope:4", "--rope-scaling"); })
                .find("rope type 'longrope' is not supported (supported: default, yarn)"),
            std::string::npos);
  for (const char* bad : {"yarn", "yarn:", "yarn:x", "yarn:4:", "yarn:4:0", "yarn:4:32:1", "yarn:0.5", "yarn:4x"})
    EXPECT_NE(error_of([&] { parse_rope_scaling_flag(bad, "--rope-scaling"); }).find("--rope-scaling"),
              std::string::npos) << bad;

  // The windows the README promises: Qwen3.5+ (262,144) to 1M, Qwen3 (32,768 native) to 131k.
  ModelConfig qwen35 = load_model_config(shared_model("tiny-qwen35"));
  apply_rope_scaling(qwen35, parse_rope_scaling_flag("yarn:4", "--rope-scaling"));
  EXPECT_EQ(qwen35.rope_scaling.original_max_position_embeddings, 262144);
  EXPECT_EQ(qwen35.context_window(), 1048576);
  ModelConfig qwen3 = load_model_config(shared_model("tiny-qwen3"));
  EXPECT_EQ(qwen3.context_window(), 40960);
  apply_rope_scaling(qwen3, parse_rope_scaling_flag("yarn:4:32768", "--rope-scaling"));
  EXPECT_EQ(qwen3.context_window(), 131072);
}

// The flag on tiny-qwen3 (the same weights as tiny-qwen3-yarn, no rope_scaling) gives the logits
// of the folder that carries it, bit for bit, and names the scaling in its KV format.
TEST(Yarn, FlagOnAPlainFolderEqualsTheConfigThatCarriesIt) {
  ServingLimits limits;
  limits.sequence_length = 128;
  limits.chunk_size = 96;
  limits.threads = 2;
  auto carried = Model::load(shared_model("tiny-qwen3-yarn"), limits);
  auto plain = Model::load(shared_model("tiny-qwen3"), limits);
  limits.rope_scaling = parse_rope_scaling_flag("yarn:4:32", "--rope-scaling");
  auto flagged = Model::load(shared_model("tiny-qwen3"), limits);
  EXPECT_EQ(flagged->kv_format(), carried->kv_format());
  EXPECT_NE(flagged->kv_format(), plain->kv_format());
  EXPECT_NE(flagged->fingerprint(), plain->fingerprint());

  const std::vector<int32_t> tokens = test::Golden("tiny-qwen3-yarn").session["tokens"];
  auto run = [&](Model& m) {
    std::vector<BatchToken> batch;
    for (int32_t p = 0; p < 95; ++p) batch.push_back({tokens[p], 0, p, p % 8 == 7 || p == 94});
    std::vector<float> logits(12 * size_t(m.vocab_size()));
    m.forward(batch, logits.data());
    return logits;
  };
  const std::vector<float> want = run(*carried);
  EXPECT_EQ(run(*flagged), want);
  EXPECT_NE(run(*plain), want);
}

}  // namespace
}  // namespace ellm
