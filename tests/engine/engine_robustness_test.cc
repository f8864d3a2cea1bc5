// The engine under hostile conditions: ids the tokenizer does not know, a model that fails
// outside forward(), readers that never read, and the session cache switched off.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "engine/engine.h"
#include "engine_fake_model.h"
#include "engine_test_util.h"
#include "text/tokenizer/tokenizer.h"

namespace ellm {
namespace {

using testing::FakeModel;
using testing::fake_greedy;





// The fake model with a vocabulary padded past the tokenizer's (as Qwen3's lm_head is), whose
// favourite on every step after `clean_steps` generated tokens is the last, tokenless id.
class PaddedVocabModel : public FakeModel {
 public:
  static constexpr int64_t kPadding = 267;  // 151,936 - 151,669 in the real models
  PaddedVocabModel(int64_t tokenizer_vocab, ServingLimits limits)
      : FakeModel(tokenizer_vocab + kPadding, limits) {}
  void forward(std::span<const BatchToken> tokens, float* logits) override {
    FakeModel::forward(tokens, logits);
    int64_t row = 0;
    for (const BatchToken& t : tokens)
      if (t.want_logits) logits[row++ * vocab_size() + vocab_size() - 1] = 100.0f;
  }
};

// The fake model whose KV release can be made to fail.
class FailingReleaseModel : public FakeModel {
 public:
  using FakeModel::FakeModel;
  void release_kv(int slot, int64_t from_position) override {
    if (fail_release) throw Error("release_kv: injected failure");
    FakeModel::release_kv(slot, from_position);
  }
  std::atomic<bool> fail_release{false};
};

// The padding rows of the embedding have no token: however high their logits, they are never
// sampled, greedy or not.
TEST(EngineRobustness, PaddingIdsAreNeverSampled) {
  auto model = std::make_unique<PaddedVocabModel>(test_tokenizer()->vocab_size(), limits(128, 2));
  const int64_t tokens = test_tokenizer()->vocab_size();
  EngineOptions options;
  options.eos_token_ids = {151645};
  Engine engine(std::move(model), test_tokenizer(), options);
  GenerateRequest r = greedy(prompt_of(8, 1), 5);
  r.sampling.top_logprobs = 2;
  GenerateRequest sampled = greedy(prompt_of(9, 2), 5);
  sampled.sampling.temperature = 0.7f;
  sampled.sampling.top_k = 3;
  sampled.sampling.seed = 1;
  auto s1 = engine.submit(r);
  auto s2 = engine.submit(sampled);  // shares the passes
  for (Outcome out : {collect(s1), collect(s2)}) {
    EXPECT_EQ(out.end.finish_reason, FinishReason::length) << out.end.error;
    ASSERT_EQ(out.ids.size(), 5u);
    for (int32_t id : out.ids) EXPECT_LT(id, tokens);
  }
  // The engine still serves.
  EXPECT_EQ(collect(engine.submit(greedy(prompt_of(4, 3), 2))).end.finish_reason, FinishReason::length);
}

TEST(EngineRobustness, ScriptedIdsWithoutATokenLeaveTheTextAround) {
  EngineOptions options;
  options.eos_token_ids = {151645};
  const int32_t tokenless = int32_t(test_tokenizer()->vocab_size() + 50);
  std::vector<int32_t> script = test_tokenizer()->encode("hello");
  script.push_back(tokenless);
  for (int32_t id : test_tokenizer()->encode(" world")) script.push_back(id);
  options.scripted_outputs = {script};
  Engine engine(std::make_unique<PaddedVocabModel>(test_tokenizer()->vocab_size(), limits(128, 1)),
                test_tokenizer(), options);
  Outcome out = collect(engine.submit(greedy(prompt_of(5, 4), 50)));
  EXPECT_EQ(out.text, "hello world");
  EXPECT_EQ(out.ids, script);
  EXPECT_EQ(out.end.finish_reason, FinishReason::stop);
}

TEST(EngineRobustness, AFailureWhileAdmittingEndsOnlyThatRequest) {
  const size_t per_token = FakeModel::kBytesPerToken;
  auto owned = std::make_unique<FailingReleaseModel>(test_tokenizer()->vocab_size(),
                                                     limits(256, 3, 0, 80 * per_token));
  FailingReleaseModel* model = owned.get();
  EngineOptions options;
  options.eos_token_ids = {151645};
  Engine engine(std::move(owned), test_tokenizer(), options);
  collect(engine.submit(greedy(prompt_of(10, 5), 19)));  // an idle session of 28 positions
  model->fail_release = true;
  auto b_prompt = prompt_of(10, 6), c_prompt = prompt_of(10, 7);
  auto b = engine.submit(greedy(b_prompt, 40));  // 50 more positions: fits beside the session
  auto c = engine.submit(greedy(c_prompt, 20));  // 30 more: must evict a session, which fails
  Outcome failed = collect(c);
  EXPECT_EQ(failed.end.finish_reason, FinishReason::error);
  EXPECT_NE(failed.end.error.find("injected failure"), std::string::npos) << failed.end.error;
  Outcome running = collect(b);
  EXPECT_EQ(running.end.finish_reason, FinishReason::length);
  EXPECT_EQ(running.ids, fake_greedy(b_prompt, 40));
  model->fail_release = false;
  Outcome after = collect(engine.submit(greedy(c_prompt, 20)));
  EXPECT_EQ(after.end.finish_reason, FinishReason::length);
  EXPECT_EQ(after.ids, fake_greedy(c_prompt, 20));
}

TEST(EngineRobustness, RequestStreamCoalescesTextForASlowReader) {
  RequestStream stream;
  std::string text;
  for (int i = 0; i < 1000; ++i) {
    StreamEvent event;
    event.text = std::to_string(i) + " ";
    event.ids = {i};
    event.logprobs.push_back({i, -1.0f, {}});
    text += event.text;
    stream.push(std::move(event));
    EXPECT_EQ(stream.queued(), 1u);
  }
  StreamEvent end;
  end.finished = true;
  end.finish_reason = FinishReason::length;
  stream.push(end);
  EXPECT_EQ(stream.queued(), 2u);

  std::optional<StreamEvent> merged = stream.next(0);
  ASSERT_TRUE(merged.has_value());
  EXPECT_FALSE(merged->finished);
  EXPECT_EQ(merged->text, text);
  ASSERT_EQ(merged->ids.size(), 1000u);
  ASSERT_EQ(merged->logprobs.size(), 1000u);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(merged->ids[i], i);
    EXPECT_EQ(merged->logprobs[i].id, i);
  }
  std::optional<StreamEvent> last = stream.next(0);
  ASSERT_TRUE(last.has_value());
  EXPECT_TRUE(last->finished);
  EXPECT_EQ(last->finish_reason, FinishReason::length);
  EXPECT_FALSE(stream.next(0).has_value());
}

TEST(EngineRobustness, AReaderThatNeverReadsDoesNotHoldTheEngineBack) {
  EngineOptions options;
  options.eos_token_ids = {151645};
  Engine engine(std::make_unique<FakeModel>(test_tokenizer()->vocab_size(), limits(1024, 2)),
                test_tokenizer(), options);
  auto prompt = prompt_of(6, 8);
  auto ignored = engine.submit(greedy(prompt, 500));
  // Another request runs to the end while the first one's reader sleeps.
  EXPECT_EQ(collect(engine.submit(greedy(prompt_of(7, 9), 20))).end.finish_reason, FinishReason::length);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (engine.metrics().requests_finished_total < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(engine.metrics().requests_finished_total, 2);
  EXPECT_LE(ignored->queued(), 2u);  // one merged text event and the end
  Outcome out = collect(ignored);
  EXPECT_EQ(out.ids, fake_greedy(prompt, 500));
  EXPECT_EQ(out.text, test_tokenizer()->decode(out.ids, true));
  EXPECT_EQ(out.end.completion_tokens, 500);
}

TEST(EngineRobustness, SessionCacheCanBeSwitchedOffEngineWide) {
  EngineOptions options;
  options.eos_token_ids = {151645};
  options.session_cache = false;
  auto owned = std::make_unique<FakeModel>(test_tokenizer()->vocab_size(), limits(256, 1));
  FakeModel* model = owned.get();
  Engine engine(std::move(owned), test_tokenizer(), options);
  auto prompt = prompt_of(30, 10);
  Outcome first = collect(engine.submit(greedy(prompt, 5)));
  int64_t fed_before = model->tokens_fed();
  Outcome again = collect(engine.submit(greedy(prompt, 5)));  // use_session_cache defaults on
  EXPECT_EQ(again.end.cached_tokens, 0);
  EXPECT_EQ(again.ids, first.ids);
  EXPECT_EQ(model->tokens_fed() - fed_before, 30 + 4);  // the whole prompt again
  EXPECT_EQ(engine.metrics().cached_tokens_total, 0);
}

}  // namespace
}  // namespace ellm
