// Speculative decoding through the engine: proposals checked in the pass change nothing in
// the output. On the fake model (exact and fast): prompt lookup copying a script, the adaptive
// depth, requests choosing their proposer. On every shared model and tier: greedy output with
// each proposer (prompt lookup, the model itself as draft model, and the MTP head of the hybrid
// ones) is token for token the output without, and seeded sampling is reproducible.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "base/cpu.h"
#include "base/error.h"
#include "engine/engine.h"
#include "engine/prompt_lookup.h"
#include "engine/speculative_depth.h"
#include "engine_fake_model.h"
#include "engine_test_util.h"
#include "test_helpers.h"
#include "tiers_under_test.h"

namespace ellm {
namespace {

using testing::FakeModel;
using testing::fake_greedy;

EngineOptions spec_options(Proposer proposer, int64_t k) {
  EngineOptions options;
  options.eos_token_ids = kEos;
  options.speculative = proposer;
  options.num_speculative_tokens = k;
  return options;
}

ServingLimits spec_limits(int64_t sequence_length, int64_t batch_size, int64_t k) {
  ServingLimits l = limits(sequence_length, batch_size);
  l.speculative_tokens = k;
  l.threads = 2;
  return l;
}

int64_t proposed(const EngineMetrics& m, Proposer p) { return m.speculative[int(p)].proposed; }
int64_t accepted(const EngineMetrics& m, Proposer p) { return m.speculative[int(p)].accepted; }

// A model that copies: the prompt holds a "file", the script is that file with two edits.
TEST(SpeculativeEngine, PromptLookupCopiesAScriptInFewPasses) {
  std::vector<int32_t> file = prompt_of(120, 3);
  std::vector<int32_t> script = file;
  script[40] = 7777;
  script.insert(script.begin() + 80, {8888, 8889});
  EngineOptions options = spec_options(Proposer::ngram, 4);
  options.scripted_outputs = {script};
  auto model = std::make_unique<FakeModel>(test_tokenizer()->vocab_size(), spec_limits(512, 1, 4));
  FakeModel* fake = model.get();
  Engine engine(std::move(model), test_tokenizer(), options);

  std::vector<int32_t> prompt = {100, 101};
  prompt.insert(prompt.end(), file.begin(), file.end());
  prompt.push_back(102);
  Outcome out = collect(engine.submit(greedy(prompt, int64_t(script.size()) + 5)));
  EXPECT_EQ(out.ids, script);
  EXPECT_EQ(out.end.completion_tokens, int64_t(script.size()));
  const EngineMetrics m = engine.metrics();
  EXPECT_GT(accepted(m, Proposer::ngram), int64_t(script.size()) * 2 / 3) << proposed(m, Proposer::ngram);
  EXPECT_LE(accepted(m, Proposer::ngram), proposed(m, Proposer::ngram));
  // One prefill, then one pass per check or step: far fewer than one per token.
  EXPECT_LT(fake->passes(), 1 + int64_t(script.size()) / 3) << fake->passes();
  EXPECT_EQ(m.generation_tokens_total, int64_t(script.size()));
}

// Two streams in the same passes: one whose proposals always miss (its "file" has every third
// token changed in the output) stops proposing after a few misses and tries again ever more
// rarely; the other copies its file at full depth. Both outputs are exact.
TEST(SpeculativeEngine, StreamsThatMissStopProposingOthersGoOn) {
  std::vector<int32_t> file_a = prompt_of(150, 8), file_b = prompt_of(100, 9);
  std::vector<int32_t> script_a = file_a;
  for (size_t i = 2; i < script_a.size(); i += 3) script_a[i] = int32_t(9000 + i);
  EngineOptions options = spec_options(Proposer::ngram, 4);
  options.scripted_outputs = {script_a, file_b};
  auto model = std::make_unique<FakeModel>(test_tokenizer()->vocab_size(), spec_limits(512, 2, 4));
  Engine engine(std::move(model), test_tokenizer(), options);
  auto a = engine.submit(greedy(file_a, 400));
  auto b = engine.submit(greedy(file_b, 400));
  Outcome out_a = collect(a), out_b = collect(b);
  EXPECT_EQ(out_a.ids, script_a);
  EXPECT_EQ(out_b.ids, file_b);
  const EngineMetrics m = engine.metrics();
  const auto& counts = m.speculative[int(Proposer::ngram)];
  // b: about 100 / 5 checks; a: a handful in its 150 steps, not one every third step.
  EXPECT_LT(counts.checks, 20 + 12) << counts.checks;
  EXPECT_GT(counts.accepted, 70);
}

TEST(SpeculativeDepth, DepthFollowsTheRateAndPausesBelowWorth) {
  SpeculativeDepth c;
  c.start(8);
  EXPECT_EQ(c.depth(), 2);  // the prior: 60% kept
  for (int i = 0; i < 10; ++i) c.record(c.depth(), c.depth());
  EXPECT_EQ(c.depth(), 8);
  c.record(8, 0);
  EXPECT_GE(c.depth(), 4);  // one miss after a long run of hits
  int misses = 1;
  for (; misses < 20 && c.depth() > 0; ++misses) c.record(c.depth(), 0);
  EXPECT_EQ(c.depth(), 0);
  EXPECT_LE(misses, 12);
  for (int i = 0; i < 8; ++i) c.step_without();
  EXPECT_EQ(c.depth(), 1);  // a try with one token
  c.record(1, 0);
  EXPECT_EQ(c.depth(), 0);  // paused again, for longer
  for (int i = 0; i < 8; ++i) c.step_without();
  EXPECT_EQ(c.depth(), 0);

  std::vector<int> depth = {4, 4, 2};
  std::vector<double> rate = {0.9, 0.5, 0.95};
  std::vector<int> granted(3);
  share_budget(depth, rate, 5, granted);
  EXPECT_EQ(depth, (std::vector<int>{3, 0, 2}));  // 0.9, 0.95, 0.9025, 0.81, 0.729 > 0.5
}

TEST(PromptLookup, ProposesWhatFollowedTheLongestLatestMatch) {
  int32_t out[4];
  // "1 2 3 9 ... 1 2 3 7 ... 2 3": the 2-gram 2 3 matches twice; the latest wins.
  std::vector<int32_t> s = {1, 2, 3, 9, 9, 5, 1, 2, 3, 7, 8, 6, 2, 3};
  ASSERT_EQ(propose_ngram(s, 4, out), 4);
  EXPECT_EQ(std::vector<int32_t>(out, out + 4), (std::vector<int32_t>{7, 8, 6, 2}));
  // Ending "1 2 3": the 3-gram's match (at 1 2 3 9) beats the later 2-gram's.
  s = {1, 2, 3, 9, 4, 2, 3, 5, 1, 2, 3};
  ASSERT_EQ(propose_ngram(s, 2, out), 2);
  EXPECT_EQ(out[0], 9);
  EXPECT_EQ(out[1], 4);
  s = {1, 2, 3, 4};  // nothing repeats
  EXPECT_EQ(propose_ngram(s, 4, out), 0);
  s = {9, 5, 6, 5, 6};  // the match runs into the end: the loop goes on
  ASSERT_EQ(propose_ngram(s, 4, out), 4);
  EXPECT_EQ(std::vector<int32_t>(out, out + 4), (std::vector<int32_t>{5, 6, 5, 6}));
  s = {3, 3, 3};
  ASSERT_EQ(propose_ngram(s, 3, out), 3);
  EXPECT_EQ(std::vector<int32_t>(out, out + 3), (std::vector<int32_t>{3, 3, 3}));
}

TEST(SpeculativeEngine, RequestsChooseTheirProposerWithinWhatTheServerHas) {
  auto model = std::make_unique<FakeModel>(test_tokenizer()->vocab_size(), spec_limits(128, 1, 2));
  Engine engine(std::move(model), test_tokenizer(), spec_options(Proposer::none, 2));
  GenerateRequest r = greedy(prompt_of(10, 1), 4);
  r.speculative = "mtp";
  EXPECT_THROW(engine.submit(r), RequestError);
  r.speculative = "draft";
  EXPECT_THROW(engine.submit(r), RequestError);
  r.speculative = "eagle";
  EXPECT_THROW(engine.submit(r), RequestError);
  r.speculative = "ngram";
  r.num_speculative_tokens = 3;
  EXPECT_THROW(engine.submit(r), RequestError);
  r.num_speculative_tokens = 2;
  EXPECT_EQ(collect(engine.submit(r)).ids, fake_greedy(prompt_of(10, 1), 4));

  auto plain = std::make_unique<FakeModel>(test_tokenizer()->vocab_size(), spec_limits(128, 1, 0));
  Engine without(std::move(plain), test_tokenizer(), spec_options(Proposer::none, 0));
  r.num_speculative_tokens = -1;
  EXPECT_THROW(without.submit(r), RequestError);
}

// The shared models, every tier: the requests of one engine with each proposer against the same
// requests without, all queued at once on two slots.
class SpeculativeModel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { isa_ = active_isa(); }
  void TearDown() override { set_active_isa(isa_); }

 private:
  Isa isa_ = Isa::scalar;
};

TEST_P(SpeculativeModel, GreedyOutputIsPlainOutputWithEveryProposer) {
  const std::string dir = ELLM_SHARED "/models/" + GetParam();
  const bool hybrid = GetParam().find("qwen35") != std::string::npos;
  std::vector<std::vector<int32_t>> prompts = {prompt_of(24, 5), prompt_of(12, 6)};
  for (int i = 0; i < 16; ++i) prompts[1].push_back(prompts[1][size_t(i)]);  // something to look up
  for (Isa isa : test::tiers_under_test()) {
    set_active_isa(isa);
    ServingLimits l = spec_limits(96, 2, 3);
    l.mtp = hybrid;
    auto model = Model::load(dir, l);
    ServingLimits draft_limits = l;
    draft_limits.mtp = false;
    auto draft = Model::load(dir, draft_limits, model.get());
    Engine engine(std::move(model), test_tokenizer(), spec_options(Proposer::none, 3), std::move(draft));
    std::vector<std::string> proposers = {"none", "ngram", "draft"};
    if (hybrid) proposers.push_back("mtp");
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const std::string& proposer : proposers)
      for (const auto& prompt : prompts) {
        GenerateRequest r = greedy(prompt, 14);
        r.speculative = proposer;
        streams.push_back(engine.submit(r));
      }
    std::vector<Outcome> outs;
    for (auto& stream : streams) outs.push_back(collect(stream));
    for (size_t i = prompts.size(); i < outs.size(); ++i)
      EXPECT_EQ(outs[i].ids, outs[i % prompts.size()].ids)
          << GetParam() << " " << isa_name(isa) << " " << proposers[i / prompts.size()] << " prompt " << i % prompts.size();
    const EngineMetrics m = engine.metrics();
    EXPECT_GT(proposed(m, Proposer::draft), 0);
    // The draft model is the model itself: it proposes what the model chooses (its rows are
    // the model's bits, whatever pass they run in), so nearly every proposal is kept; a hybrid
    // draft catches up over the prompt and its first token in one pass, whose chunked delta
    // rule rounds differently from the model's, and may differ at a near-tie.
    if (!hybrid) EXPECT_EQ(accepted(m, Proposer::draft), proposed(m, Proposer::draft)) << isa_name(isa);
    if (hybrid) EXPECT_GT(proposed(m, Proposer::mtp), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(SharedModels, SpeculativeModel,
                         ::testing::Values("tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen3-fp8",
                                           "tiny-qwen3-moe-fp8", "tiny-qwen3-gptq", "tiny-qwen3-awq",
                                           "tiny-qwen35", "tiny-qwen35-moe"),
                         test::ModelTestName());

// Prompt lookup on a prompt with a screenshot (tiny-qwen35-vl, its golden session's first feed):
// the checked rows sit after the image, so they must carry its rope offset (rope_delta -21 here)
// as decode rows do. A script that copies the question after the image makes the lookups propose
// and keep; the log-probabilities of the scripted tokens (from the model's logits) are those of
// the run without proposals, on every tier.
TEST(SpeculativeEngine, PromptLookupWithAnImageKeepsTheLogits) {
  const std::string model_name = "tiny-qwen35-vl";
  const nlohmann::json session = golden_session(model_name);
  const nlohmann::json& image = session["images"][0];
  PromptImage prompt_image;
  prompt_image.first = image["first_token_index"];
  prompt_image.grid_t = image["grid_thw"][0], prompt_image.grid_h = image["grid_thw"][1];
  prompt_image.grid_w = image["grid_thw"][2];
  prompt_image.merged_h = image["merged_grid_hw"][0], prompt_image.merged_w = image["merged_grid_hw"][1];
  std::ifstream pixels_file(ELLM_SHARED "/golden/" + model_name + "/" + image["pixel_values"].get<std::string>(),
                            std::ios::binary);
  std::vector<float> pixels(size_t(prompt_image.grid_t * prompt_image.grid_h * prompt_image.grid_w * 1536));
  pixels_file.read(reinterpret_cast<char*>(pixels.data()), std::streamsize(pixels.size() * sizeof(float)));
  ASSERT_TRUE(pixels_file) << "image0_pixel_values.f32";
  prompt_image.pixel_values = std::make_shared<const std::vector<float>>(std::move(pixels));
  prompt_image.content_hash = 0x5c4ee45407ull;
  const std::vector<int32_t> prompt = session["feeds"][0].get<std::vector<int32_t>>();
  // The question after the image ("What is on this screen? Is there an error?"), three times.
  const int64_t question = prompt_image.first + prompt_image.n_tokens() + 1;
  std::vector<int32_t> script;
  for (int i = 0; i < 3; ++i) script.insert(script.end(), prompt.begin() + question, prompt.begin() + question + 11);

  const Isa saved = active_isa();
  for (Isa isa : test::tiers_under_test()) {
    set_active_isa(isa);
    std::vector<Outcome> outs;
    int64_t kept = 0;
    for (Proposer proposer : {Proposer::none, Proposer::ngram}) {
      EngineOptions options = spec_options(proposer, 4);
      options.scripted_outputs = {script};
      Engine engine(Model::load(ELLM_SHARED "/models/" + model_name, spec_limits(256, 1, 4)), test_tokenizer(),
                    options);
      GenerateRequest r = greedy(prompt, int64_t(script.size()));
      r.images = {prompt_image};
      r.sampling.top_logprobs = 0;
      outs.push_back(collect(engine.submit(r)));
      kept = accepted(engine.metrics(), Proposer::ngram);
    }
    ASSERT_EQ(outs[0].ids, script) << outs[0].end.error;
    ASSERT_EQ(outs[1].ids, script) << outs[1].end.error;
    EXPECT_GT(kept, int64_t(script.size()) / 3) << isa_name(isa);
    ASSERT_EQ(outs[0].logprobs.size(), script.size());
    ASSERT_EQ(outs[1].logprobs.size(), script.size());
    double worst = 0;
    for (size_t i = 0; i < script.size(); ++i)
      worst = std::max(worst, double(std::abs(outs[0].logprobs[i].logprob - outs[1].logprobs[i].logprob)));
    std::printf("[%s %s] prompt lookup after an image: %lld of %zu tokens from proposals, logprob max |diff| %.2e\n",
                model_name.c_str(), isa_name(isa), (long long)kept, script.size(), worst);
    EXPECT_LT(worst, 1e-3) << isa_name(isa);
  }
  set_active_isa(saved);
}

// Sampling with proposals: a seeded request gives the same tokens every time.
TEST(SpeculativeEngine, SeededSamplingIsReproducible) {
  const std::string dir = ELLM_SHARED "/models/tiny-qwen3";
  std::vector<int32_t> first;
  for (int run = 0; run < 2; ++run) {
    ServingLimits l = spec_limits(96, 1, 3);
    auto model = Model::load(dir, l);
    auto draft = Model::load(dir, l, model.get());
    Engine engine(std::move(model), test_tokenizer(), spec_options(Proposer::draft, 3), std::move(draft));
    GenerateRequest r = greedy(prompt_of(20, 7), 24);
    r.sampling.temperature = 0.9f;
    r.sampling.seed = 1234;
    Outcome out = collect(engine.submit(r));
    ASSERT_EQ(out.ids.size(), 24u);
    if (run == 0) first = out.ids;
    else EXPECT_EQ(out.ids, first);
    EXPECT_GT(proposed(engine.metrics(), Proposer::draft), 0);
  }
}

}  // namespace
}  // namespace ellm
