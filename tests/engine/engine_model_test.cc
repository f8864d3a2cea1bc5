// The engine on the real tiny models in shared/models: greedy output against the reference
// completions and a plain forward loop, the session cache against cold runs, and continuous
// batching with more requests than slots.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/sampling.h"
#include "engine_test_util.h"
#include "test_helpers.h"
#include "model/model.h"
#include "text/tokenizer/tokenizer.h"

namespace ellm {
namespace {

std::string model_dir(const std::string& name) { return ELLM_SHARED "/models/" + name; }

const std::shared_ptr<const Tokenizer>& tokenizer() {
  static auto tok = Tokenizer::load(model_dir("tiny-qwen3"));  // both models share it
  return tok;
}

std::unique_ptr<Engine> make_engine(const std::string& name, int64_t batch_size,
                                    int64_t chunk_size = 0) {
  ServingLimits limits;
  limits.sequence_length = 1024;
  limits.batch_size = batch_size;
  limits.chunk_size = chunk_size;
  limits.threads = 1;
  EngineOptions options;
  options.eos_token_ids = kEos;
  return std::make_unique<Engine>(Model::load(model_dir(name), limits), tokenizer(), options);
}

class EngineModel : public ::testing::TestWithParam<std::string> {};

bool hybrid(const std::string& name) {
  return name.find("qwen35") != std::string::npos || name.find("qwen4exp") != std::string::npos;
}

// A hybrid model's prompt chunks follow what else shares the passes, and its chunked delta
// rule rounds differently from the recurrence, so its logits agree with a solo run within
// the golden tolerance, not to the bit, and a near-tie may go either way. What holds: every
// token it chose is within the golden atol of the best one, fed once through a plain model.
void expect_near_greedy(const std::string& name, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& generated, const std::string& what) {
  const double atol = golden_session(name)["atol"];
  std::vector<int32_t> sequence = prompt;
  sequence.insert(sequence.end(), generated.begin(), generated.end());
  const std::vector<float> logits = plain_logits(name, sequence, prompt.size());
  const size_t V = logits.size() / generated.size();
  for (size_t i = 0; i < generated.size(); ++i) {
    const float* row = logits.data() + i * V;
    EXPECT_GE(row[generated[i]], *std::max_element(row, row + V) - atol) << what << " token " << i;
  }
}

// shared/golden/<model>/chat.json: every clear-margin case, token for token, all submitted at
// once into two slots.
TEST_P(EngineModel, GreedyMatchesTheReferenceCompletions) {
  std::ifstream file(ELLM_SHARED "/golden/" + GetParam() + "/chat.json");
  ASSERT_TRUE(file) << "missing golden chat.json";
  nlohmann::json golden = nlohmann::json::parse(file);
  const double safe_margin = golden["safe_margin"];
  auto engine = make_engine(GetParam(), 2);

  std::vector<nlohmann::json> cases;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& c : golden["cases"]) {
    if (c["min_margin"].get<double>() < safe_margin) continue;
    cases.push_back(c);
    streams.push_back(engine->submit(greedy(c["prompt_ids"].get<std::vector<int32_t>>(),
                                            c["request"]["max_tokens"].get<int64_t>())));
  }
  if (cases.empty()) GTEST_SKIP() << "no case with min_margin >= safe_margin for this model";
  for (size_t i = 0; i < cases.size(); ++i) {
    Outcome out = collect(streams[i]);
    const std::string name = cases[i]["name"];
    EXPECT_EQ(out.ids, cases[i]["completion_ids"].get<std::vector<int32_t>>()) << name;
    EXPECT_EQ(out.text, cases[i]["completion_text"].get<std::string>()) << name;
    EXPECT_EQ(out.end.prompt_tokens, int64_t(cases[i]["prompt_ids"].size())) << name;
  }
}

// The engine alone in its slot runs exactly the passes of a plain loop: prefill, then one token
// at a time, each choosing the argmax.
TEST_P(EngineModel, GreedyEqualsAPlainForwardLoop) {
  const std::vector<int32_t> prompt = tokenizer()->encode("The quick brown fox jumps over the lazy dog.");
  const int steps = 12;

  ServingLimits limits;
  limits.sequence_length = 128;
  limits.threads = 1;
  auto model = Model::load(model_dir(GetParam()), limits);
  std::vector<float> logits(model->vocab_size());
  std::vector<BatchToken> batch;
  for (size_t p = 0; p < prompt.size(); ++p)
    batch.push_back({prompt[p], 0, int32_t(p), p + 1 == prompt.size()});
  std::vector<int32_t> expected;
  for (int i = 0; i < steps; ++i) {
    model->forward(batch, logits.data());
    expected.push_back(argmax(logits));
    batch = {{expected.back(), 0, int32_t(prompt.size() + i), true}};
  }

  auto engine = make_engine(GetParam(), 1);
  GenerateRequest r = greedy(prompt, steps);
  r.ignore_eos = true;
  EXPECT_EQ(collect(engine->submit(r)).ids, expected);
}

// A 3-turn conversation resending its history: each turn reuses at least the previous turn's
// prompt and produces what a cold run of the same prompt produces.
TEST_P(EngineModel, SessionCacheMatchesColdRuns) {
  auto warm = make_engine(GetParam(), 2);
  auto cold = make_engine(GetParam(), 1);
  std::vector<int32_t> history = tokenizer()->encode(
      "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello there!<|im_end|>\n"
      "<|im_start|>assistant\n");
  const char* turns[] = {"Tell me about caching.", "And about batching?"};
  int64_t previous_prompt = 0;
  for (int turn = 0; turn < 3; ++turn) {
    GenerateRequest request = greedy(history, 10);
    request.ignore_eos = true;
    request.sampling.top_logprobs = 2;  // the margins of the reference
    Outcome out = collect(warm->submit(request));
    request.use_session_cache = false;
    Outcome reference = collect(cold->submit(request));
    EXPECT_GE(out.end.cached_tokens, previous_prompt) << "turn " << turn;
    if (hybrid(GetParam())) {  // resumed from the snapshot where the last turn ended
      expect_same_at_clear_margins(GetParam(), out, reference, "turn " + std::to_string(turn));
    } else {
      EXPECT_EQ(out.ids, reference.ids) << "turn " << turn;
      EXPECT_EQ(out.text, reference.text) << "turn " << turn;
    }
    previous_prompt = int64_t(history.size());
    if (turn == 2) break;
    history.insert(history.end(), out.ids.begin(), out.ids.end());
    auto next = tokenizer()->encode(std::string("<|im_end|>\n<|im_start|>user\n") + turns[turn] +
                                    "<|im_end|>\n<|im_start|>assistant\n");
    history.insert(history.end(), next.begin(), next.end());
  }
  EXPECT_GT(warm->metrics().cached_tokens_total, 0);
  EXPECT_EQ(warm->metrics().recomputed_tokens_total, 0) << "each turn resumes where the last one ended";
}

// Four requests in two slots with chunked prefill: all finish with their solo output.
TEST_P(EngineModel, FourRequestsInTwoSlots) {
  std::vector<std::vector<int32_t>> prompts;
  for (const char* text : {"One fish, two fish.", "Red fish, blue fish, and a long line of other fish.",
                           "Hello", "Count: 1 2 3 4 5 6 7 8 9 10 11 12"})
    prompts.push_back(tokenizer()->encode(text));
  auto solo = make_engine(GetParam(), 1);
  std::vector<std::vector<int32_t>> expected;
  for (auto& p : prompts) {
    GenerateRequest r = greedy(p, 8);
    r.ignore_eos = true;
    expected.push_back(collect(solo->submit(r)).ids);
  }

  auto engine = make_engine(GetParam(), 2, /*chunk_size=*/5);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (auto& p : prompts) {
    GenerateRequest r = greedy(p, 8);
    r.ignore_eos = true;
    streams.push_back(engine->submit(r));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    Outcome out = collect(streams[i]);
    EXPECT_EQ(out.end.finish_reason, FinishReason::length);
    EXPECT_EQ(out.end.completion_tokens, 8);
    if (!hybrid(GetParam()))
      EXPECT_EQ(out.ids, expected[i]) << "request " << i;
    else
      expect_near_greedy(GetParam(), prompts[i], out.ids, "request " + std::to_string(i));
  }
  EngineMetrics m = engine->metrics();
  EXPECT_EQ(m.requests_finished_total, 4);
  EXPECT_GT(m.kv_resident_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, EngineModel,
                         ::testing::Values("tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen35",
                                           "tiny-qwen35-moe", "tiny-qwen4exp"),
                         test::ModelTestName());

}  // namespace
}  // namespace ellm
