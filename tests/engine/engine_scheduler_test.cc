// Scheduler behaviour on the fake model (engine_fake_model.h): exact, fast and strict about the
// Model contract. The same properties on the real tiny models are in engine_model_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "base/error.h"
#include "engine/engine.h"
#include "engine_test_util.h"
#include "engine_fake_model.h"
#include "text/tokenizer/tokenizer.h"

namespace ellm {
namespace {

using testing::FakeModel;
using testing::fake_greedy;
using testing::FakeEngine;
using testing::make_engine;

TEST(EngineScheduler, GreedyFollowsTheModelsArgmax) {
  auto [model, engine] = make_engine(limits(128, 1));
  auto prompt = prompt_of(20, 1);
  Outcome out = collect(engine->submit(greedy(prompt, 12)));
  EXPECT_EQ(out.ids, fake_greedy(prompt, 12));
  EXPECT_EQ(out.text, test_tokenizer()->decode(out.ids, true));
  EXPECT_EQ(out.end.finish_reason, FinishReason::length);
  EXPECT_EQ(out.end.prompt_tokens, 20);
  EXPECT_EQ(out.end.completion_tokens, 12);
  EXPECT_EQ(out.end.cached_tokens, 0);
  // One prefill pass, then one pass per further token.
  EXPECT_EQ(model->tokens_fed(), 20 + 11);
}

TEST(EngineScheduler, SessionCacheReusesTheSharedPrefix) {
  auto [model, engine] = make_engine(limits(256, 2));
  auto [cold_model, cold_engine] = make_engine(limits(256, 1));
  std::vector<int32_t> history = prompt_of(30, 2);
  int64_t previous_prompt = 0;
  for (int turn = 0; turn < 3; ++turn) {
    int64_t fed_before = model->tokens_fed();
    Outcome warm = collect(engine->submit(greedy(history, 10)));
    GenerateRequest cold = greedy(history, 10);
    cold.use_session_cache = false;
    Outcome reference = collect(cold_engine->submit(cold));
    EXPECT_EQ(warm.ids, reference.ids) << "turn " << turn;
    EXPECT_GE(warm.end.cached_tokens, previous_prompt) << "turn " << turn;
    EXPECT_EQ(reference.end.cached_tokens, 0);
    // Only the uncached part of the prompt is prefilled.
    EXPECT_EQ(model->tokens_fed() - fed_before, int64_t(history.size()) - warm.end.cached_tokens + 9);
    previous_prompt = int64_t(history.size());
    history.insert(history.end(), warm.ids.begin(), warm.ids.end());
    auto user = prompt_of(7, 10 + turn);
    history.insert(history.end(), user.begin(), user.end());
  }
  EXPECT_GT(engine->metrics().cached_tokens_total, 0);
}

TEST(EngineScheduler, SessionCacheReusesUpToWhereHistoryDiverges) {
  auto [model, engine] = make_engine(limits(256, 1));
  auto first = prompt_of(40, 3);
  collect(engine->submit(greedy(first, 5)));
  auto edited = first;
  edited[25] = 4242;  // e.g. a dropped <think> block changes the middle
  Outcome out = collect(engine->submit(greedy(edited, 5)));
  EXPECT_EQ(out.end.cached_tokens, 25);
  EXPECT_EQ(out.ids, fake_greedy(edited, 5));
  // The same prompt again: everything but the last prompt token is reused.
  Outcome again = collect(engine->submit(greedy(edited, 5)));
  EXPECT_EQ(again.end.cached_tokens, 39);
  EXPECT_EQ(again.ids, out.ids);
}

TEST(EngineScheduler, PrefersTheSlotHoldingTheConversation) {
  auto [model, engine] = make_engine(limits(256, 3));
  auto a = prompt_of(30, 4), b = prompt_of(30, 5);
  Outcome ra = collect(engine->submit(greedy(a, 4)));
  collect(engine->submit(greedy(b, 4)));
  collect(engine->submit(greedy(prompt_of(12, 6), 4)));
  a.insert(a.end(), ra.ids.begin(), ra.ids.end());
  a.push_back(77);
  Outcome follow = collect(engine->submit(greedy(a, 4)));
  EXPECT_EQ(follow.end.cached_tokens, 33);  // 30 prompt + 3 generated tokens fed back
  EXPECT_EQ(follow.ids, fake_greedy(a, 4));
}

TEST(EngineScheduler, MoreRequestsThanSlotsAllFinishCorrectly) {
  auto [model, engine] = make_engine(limits(128, 2));
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(prompt_of(5 + 7 * i, 20 + i));
    streams.push_back(engine->submit(greedy(prompts.back(), 8 + i)));
  }
  for (int i = 0; i < 6; ++i) {
    Outcome out = collect(streams[i]);
    EXPECT_EQ(out.end.finish_reason, FinishReason::length);
    EXPECT_EQ(out.ids, fake_greedy(prompts[i], 8 + i)) << "request " << i;
  }
  EngineMetrics m = engine->metrics();
  EXPECT_EQ(m.requests_finished_total, 6);
  EXPECT_EQ(m.requests_running, 0);
  EXPECT_EQ(m.requests_waiting, 0);
  EXPECT_EQ(m.time_to_first_token.count, 6);
  EXPECT_EQ(m.e2e_latency.count, 6);
  EXPECT_EQ(m.generation_tokens_total, 8 + 9 + 10 + 11 + 12 + 13);
}

TEST(EngineScheduler, ChunkedPrefillGivesTheSameTokens) {
  auto [model, engine] = make_engine(limits(128, 2, /*chunk_size=*/4));
  auto p1 = prompt_of(19, 7), p2 = prompt_of(11, 8);
  auto s1 = engine->submit(greedy(p1, 6));
  auto s2 = engine->submit(greedy(p2, 6));
  EXPECT_EQ(collect(s1).ids, fake_greedy(p1, 6));
  EXPECT_EQ(collect(s2).ids, fake_greedy(p2, 6));
  EXPECT_LE(model->max_pass_seen(), 4 + 2);
}

TEST(EngineScheduler, QueueFullIsRefused) {
  EngineOptions options;
  options.max_queue = 1;
  auto [model, engine] = make_engine(limits(4096, 1), options);
  auto running = engine->submit(greedy(prompt_of(4, 9), 4000));
  auto waiting = engine->submit(greedy(prompt_of(4, 10), 4));
  EXPECT_THROW(engine->submit(greedy(prompt_of(4, 11), 4)), QueueFull);
  running->cancel();
  EXPECT_EQ(collect(running).end.finish_reason, FinishReason::abort);
  EXPECT_EQ(collect(waiting).end.finish_reason, FinishReason::length);
}

TEST(EngineScheduler, CancellationFreesTheSlot) {
  auto [model, engine] = make_engine(limits(4096, 1));
  auto long_one = engine->submit(greedy(prompt_of(8, 12), 4000));
  auto first = long_one->next(10000);  // generation has started
  ASSERT_TRUE(first.has_value());
  auto next = engine->submit(greedy(prompt_of(8, 13), 5));
  long_one->cancel();
  Outcome aborted = collect(long_one);
  EXPECT_EQ(aborted.end.finish_reason, FinishReason::abort);
  EXPECT_LT(aborted.end.completion_tokens, 4000);
  Outcome out = collect(next);
  EXPECT_EQ(out.end.finish_reason, FinishReason::length);
  EXPECT_EQ(out.ids, fake_greedy(prompt_of(8, 13), 5));
  EXPECT_EQ(engine->metrics().requests_running, 0);
}

// Two slots, slot 0 generating (5 ms a step, up to 3000 tokens) when this returns, so that a
// long prompt arriving next finds a stream to stall.
struct WhileGenerating {
  FakeEngine fake;
  std::vector<int32_t> prompt;
  std::shared_ptr<RequestStream> stream;
  std::vector<int32_t> first_ids;

  WhileGenerating(double max_stall_seconds, int seed, bool tower = false) {
    EngineOptions options;
    options.max_decode_stall_seconds = max_stall_seconds;
    fake = make_engine(limits(4096, 2), options, /*hybrid=*/false, tower);
    fake.model->pass_delay_ms = 5;
    prompt = prompt_of(8, seed);
    stream = fake.engine->submit(greedy(prompt, 3000));
    auto first = stream->next(10000);
    EXPECT_TRUE(first.has_value());
    if (first) first_ids = first->ids;
  }
  // Ends the generating request; its tokens must be what the model implies.
  void stop() {
    stream->cancel();
    Outcome rest = collect(stream);
    std::vector<int32_t> ids = first_ids;
    ids.insert(ids.end(), rest.ids.begin(), rest.ids.end());
    EXPECT_EQ(ids, fake_greedy(prompt, int64_t(ids.size())));
  }
};

// A long prefill while another slot generates runs in parts, with that slot's decode steps in
// between; both outputs are still exactly what the model implies.
TEST(EngineScheduler, LongPrefillRunsInPartsWhileOthersDecode) {
  WhileGenerating busy(0.2, 30);
  FakeModel* model = busy.fake.model;
  model->part_delay_us_per_row = 200;  // 4 layers x 1500 rows: 1.2 s
  const auto long_prompt = prompt_of(1500, 31);
  Outcome long_out = collect(busy.fake.engine->submit(greedy(long_prompt, 3)));
  EXPECT_EQ(long_out.ids, fake_greedy(long_prompt, 3));
  EXPECT_EQ(model->split_passes(), 1);
  EXPECT_GE(model->passes_between_parts(), 2);
  busy.stop();
}

TEST(EngineScheduler, NoStallLimitMeansOnePass) {
  WhileGenerating busy(0, 32);
  const auto long_prompt = prompt_of(1500, 33);
  Outcome long_out = collect(busy.fake.engine->submit(greedy(long_prompt, 3)));
  EXPECT_EQ(long_out.ids, fake_greedy(long_prompt, 3));
  EXPECT_EQ(busy.fake.model->split_passes(), 0);
  busy.stop();
}

// A client that gives up during a long prefill stops it at the next part; the half-written KV
// is never reused.
TEST(EngineScheduler, CancelledLongPrefillStopsBetweenParts) {
  WhileGenerating busy(0.2, 34);
  FakeModel* model = busy.fake.model;
  model->part_delay_us_per_row = 200;
  const auto long_prompt = prompt_of(1500, 35);
  auto long_one = busy.fake.engine->submit(greedy(long_prompt, 3));
  for (int i = 0; i < 1000 && model->parts_run() < 10; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  long_one->cancel();
  Outcome aborted = collect(long_one);
  EXPECT_EQ(aborted.end.finish_reason, FinishReason::abort);
  EXPECT_EQ(aborted.end.completion_tokens, 0);
  EXPECT_EQ(model->cancelled_passes_, 1);
  EXPECT_LT(model->parts_run(), 4 * 1500 / 16);
  busy.stop();
  model->part_delay_us_per_row = 0;
  model->pass_delay_ms = 0;
  Outcome again = collect(busy.fake.engine->submit(greedy(long_prompt, 3)));
  EXPECT_EQ(again.ids, fake_greedy(long_prompt, 3));
  EXPECT_EQ(again.end.cached_tokens, 0);
}

// A prompt of 5 words, a 4 x 4-patch image (4 pads, patches of `pixel`) and 3 words; what the
// fake model's greedy decoding gives for it: the pads' rows stand in their places.
struct ImagePrompt {
  GenerateRequest request;
  std::vector<int32_t> as_fed;
  ImagePrompt(int seed, float pixel, int64_t max_tokens) {
    std::vector<int32_t> prompt = prompt_of(5, seed);
    PromptImage image;
    image.first = int64_t(prompt.size());
    image.grid_h = image.grid_w = 4;
    image.merged_h = image.merged_w = 2;
    image.pixel_values = std::make_shared<const std::vector<float>>(16, pixel);
    image.content_hash = uint64_t(pixel * 1000);
    prompt.insert(prompt.end(), 4, FakeModel::kImagePad);
    for (int32_t id : prompt_of(3, seed + 1)) prompt.push_back(id);
    as_fed = prompt;
    for (int64_t k = 0; k < 4; ++k) as_fed[size_t(image.first + k)] = int32_t(100 + 16 * pixel + float(k));
    request = greedy(prompt, max_tokens);
    request.images = {image};
  }
};

// A screenshot's tower runs in stages before the pass that feeds its pads; a slot generating
// meanwhile gets its decode steps between the stages instead of waiting for all of them, and
// both outputs are exactly what the model implies.
TEST(EngineScheduler, ImageEncodesInStagesWhileOthersDecode) {
  WhileGenerating busy(0.05, 40, /*tower=*/true);
  FakeModel* model = busy.fake.model;
  model->image_stage_delay_ms = 30;  // 6 stages: 180 ms, against a stall limit of 50
  const ImagePrompt image(41, 0.5f, 3);
  Outcome out = collect(busy.fake.engine->submit(image.request));
  EXPECT_EQ(out.ids, fake_greedy(image.as_fed, 3));
  EXPECT_EQ(model->images_encoded(), 1);
  EXPECT_EQ(model->image_stages_run(), FakeModel::kImageStages);
  EXPECT_GE(model->passes_between_image_stages(), 2);
  EXPECT_EQ(busy.fake.engine->metrics().images_encoded_total, 1);
  busy.stop();
}

// With no stall limit the tower runs through; the same image in another prompt comes from the
// image cache, not the tower.
TEST(EngineScheduler, NoStallLimitEncodesAnImageThroughAndTheCacheServesItAgain) {
  WhileGenerating busy(0, 42, /*tower=*/true);
  FakeModel* model = busy.fake.model;
  model->image_stage_delay_ms = 10;
  const ImagePrompt first(43, 0.25f, 2), again(45, 0.25f, 2);
  EXPECT_EQ(collect(busy.fake.engine->submit(first.request)).ids, fake_greedy(first.as_fed, 2));
  EXPECT_EQ(model->passes_between_image_stages(), 0);
  EXPECT_EQ(collect(busy.fake.engine->submit(again.request)).ids, fake_greedy(again.as_fed, 2));
  EXPECT_EQ(model->images_encoded(), 1);
  EngineMetrics m = busy.fake.engine->metrics();
  EXPECT_EQ(m.images_encoded_total, 1);
  EXPECT_EQ(m.image_cache_hits_total, 1);
  busy.stop();
}

// A client that gives up while its image encodes stops the tower at the next stage; the slot
// generating beside it goes on, and the next image request is encoded from the start.
TEST(EngineScheduler, CancelledImageStopsBetweenStages) {
  WhileGenerating busy(0.05, 46, /*tower=*/true);
  FakeModel* model = busy.fake.model;
  model->image_stage_delay_ms = 50;
  const ImagePrompt image(47, 0.75f, 3);
  auto stream = busy.fake.engine->submit(image.request);
  for (int i = 0; i < 1000 && model->image_stages_run() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stream->cancel();
  Outcome aborted = collect(stream);
  EXPECT_EQ(aborted.end.finish_reason, FinishReason::abort);
  EXPECT_EQ(model->images_encoded(), 0);
  EXPECT_LT(model->image_stages_run(), FakeModel::kImageStages);
  model->image_stage_delay_ms = 0;
  EXPECT_EQ(collect(busy.fake.engine->submit(image.request)).ids, fake_greedy(image.as_fed, 3));
  EXPECT_EQ(model->images_encoded(), 1);
  busy.stop();
}

// A shutdown stops a long prefill at the next part instead of waiting for all of it.
TEST(EngineScheduler, ShutdownStopsALongPrefillBetweenParts) {
  WhileGenerating busy(0.2, 36);
  FakeModel* model = busy.fake.model;
  model->part_delay_us_per_row = 200;
  auto long_one = busy.fake.engine->submit(greedy(prompt_of(1500, 37), 3));
  for (int i = 0; i < 1000 && model->parts_run() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  busy.fake.engine->shutdown(std::chrono::steady_clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(collect(long_one).end.finish_reason, FinishReason::abort);
  EXPECT_EQ(collect(busy.stream).end.finish_reason, FinishReason::abort);
  EXPECT_EQ(model->cancelled_passes_, 1);
  EXPECT_LT(model->parts_run(), 4 * 1500 / 16);
}

TEST(EngineScheduler, CancelledWhileWaitingNeverRuns) {
  auto [model, engine] = make_engine(limits(4096, 1));
  auto busy = engine->submit(greedy(prompt_of(8, 14), 4000));
  auto queued = engine->submit(greedy(prompt_of(8, 15), 5));
  queued->cancel();
  Outcome out = collect(queued);
  EXPECT_EQ(out.end.finish_reason, FinishReason::abort);
  EXPECT_EQ(out.end.completion_tokens, 0);
  busy->cancel();
  collect(busy);
}

TEST(EngineScheduler, StopStringsEndGenerationAndAreNotEmitted) {
  auto [model, engine] = make_engine(limits(256, 1));
  auto prompt = prompt_of(10, 16);
  Outcome free_run = collect(engine->submit(greedy(prompt, 20)));
  ASSERT_GT(free_run.text.size(), 20u);
  // A stop string straddling tokens in the middle of the free run's text.
  std::string piece = test_tokenizer()->decode(std::span(free_run.ids).first(6), true);
  std::string stop = free_run.text.substr(piece.size() - 2, 4);
  size_t first = free_run.text.find(stop);
  GenerateRequest r = greedy(prompt, 20);
  r.stop = {stop};
  Outcome out = collect(engine->submit(r));
  EXPECT_EQ(out.end.finish_reason, FinishReason::stop);
  EXPECT_EQ(out.text, free_run.text.substr(0, first));
  EXPECT_EQ(out.text.find(stop), std::string::npos);
  EXPECT_EQ(out.end.stop_sequence, stop);  // which one ended it (the Messages API reports it)
  EXPECT_EQ(free_run.end.stop_sequence, "");
}

TEST(EngineScheduler, StopTokenIdsAndEos) {
  auto [model, engine] = make_engine(limits(256, 1));
  auto prompt = prompt_of(10, 17);
  auto expected = fake_greedy(prompt, 10);
  GenerateRequest r = greedy(prompt, 10);
  r.stop_token_ids = {expected[4]};
  size_t first = std::find(expected.begin(), expected.end(), expected[4]) - expected.begin();
  Outcome out = collect(engine->submit(r));
  EXPECT_EQ(out.end.finish_reason, FinishReason::stop);
  EXPECT_EQ(out.ids, std::vector<int32_t>(expected.begin(), expected.begin() + first));
  EXPECT_EQ(out.end.completion_tokens, int64_t(first) + 1);  // the stop token counts

  // An eos id from the options stops too, unless ignore_eos.
  EngineOptions options;
  options.eos_token_ids = {expected[2]};
  auto [model2, engine2] = make_engine(limits(256, 1), options);
  size_t eos_at = std::find(expected.begin(), expected.end(), expected[2]) - expected.begin();
  EXPECT_EQ(collect(engine2->submit(greedy(prompt, 10))).ids.size(), eos_at);
  GenerateRequest ignoring = greedy(prompt, 10);
  ignoring.ignore_eos = true;
  EXPECT_EQ(collect(engine2->submit(ignoring)).ids, expected);
}

TEST(EngineScheduler, MaxTokensBeyondTheContextIsShortenedToFit) {
  auto [model, engine] = make_engine(limits(64, 1));
  GenerateRequest beyond = greedy(prompt_of(60, 18), 64000);
  beyond.ignore_eos = true;
  Outcome out = collect(engine->submit(beyond));
  EXPECT_EQ(out.end.completion_tokens, 4);
  EXPECT_EQ(out.end.finish_reason, FinishReason::length);
  EXPECT_EQ(out.ids, fake_greedy(prompt_of(60, 18), 4));
}

TEST(EngineScheduler, StrictMaxTokensRefusesBeyondTheContext) {
  EngineOptions strict;
  strict.strict_max_tokens = true;
  auto [model, engine] = make_engine(limits(64, 1), strict);
  try {
    engine->submit(greedy(prompt_of(60, 18), 10));
    FAIL() << "accepted a request beyond the sequence length";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.param, "max_tokens");
    EXPECT_NE(std::string(e.what()).find("64"), std::string::npos) << e.what();
  }
  EXPECT_EQ(collect(engine->submit(greedy(prompt_of(60, 18), 4))).ids, fake_greedy(prompt_of(60, 18), 4));
}

TEST(EngineScheduler, InvalidRequestsAreRejectedWithTheLimit) {
  auto [model, engine] = make_engine(limits(64, 1));
  EXPECT_THROW(engine->submit(greedy(prompt_of(64, 18), -1)), Error);
  EXPECT_THROW(engine->submit(greedy({}, 5)), Error);
  EXPECT_THROW(engine->submit(greedy({1, int32_t(test_tokenizer()->vocab_size())}, 5)), Error);
  EXPECT_THROW(engine->submit(greedy({1, -3}, 5)), Error);
  EXPECT_THROW(engine->submit(greedy({1, 2}, 0)), Error);
  GenerateRequest nan_temperature = greedy({1, 2}, 5);
  nan_temperature.sampling.temperature = std::nanf("");
  EXPECT_THROW(engine->submit(nan_temperature), Error);
  // max_tokens -1 fills the slot: 63 prompt tokens leave one.
  Outcome out = collect(engine->submit(greedy(prompt_of(63, 19), -1)));
  EXPECT_EQ(out.end.completion_tokens, 1);
  EXPECT_EQ(out.end.finish_reason, FinishReason::length);
}

TEST(EngineScheduler, KvBudgetEvictsIdleSessionsBeforeRefusing) {
  const size_t per_token = FakeModel::kBytesPerToken;
  auto [model, engine] = make_engine(limits(256, 2, 0, 64 * per_token));
  auto a = prompt_of(10, 20), b = prompt_of(10, 21);
  collect(engine->submit(greedy(a, 20)));  // slot keeps 29 positions
  Outcome rb = collect(engine->submit(greedy(b, 40)));  // 50 + 29 > 64: a's session goes
  EXPECT_EQ(rb.ids, fake_greedy(b, 40));
  EXPECT_GE(model->releases(), 1);
  Outcome again = collect(engine->submit(greedy(a, 5)));
  EXPECT_EQ(again.end.cached_tokens, 0);
  EXPECT_EQ(again.ids, fake_greedy(a, 5));
  try {
    engine->submit(greedy(prompt_of(64, 20), 5));
    FAIL() << "accepted a prompt that fills the KV budget";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV memory budget"), std::string::npos) << e.what();
  }
  Outcome clamped = collect(engine->submit(greedy(a, 60)));  // 10 + 60 > 64: shortened to 54
  EXPECT_LE(clamped.end.completion_tokens, 54);
  EXPECT_EQ(clamped.ids, fake_greedy(a, clamped.end.completion_tokens));
  EngineMetrics m = engine->metrics();
  EXPECT_EQ(m.kv_budget_bytes, 64 * per_token);
  EXPECT_LE(m.kv_resident_bytes, 64 * per_token);
}

TEST(EngineScheduler, ConcurrentRequestsWaitForBudgetInsteadOfFailing) {
  const size_t per_token = FakeModel::kBytesPerToken;
  auto [model, engine] = make_engine(limits(256, 2, 0, 60 * per_token));
  auto a = prompt_of(10, 22), b = prompt_of(10, 23);
  auto sa = engine->submit(greedy(a, 30));  // 40 positions reserved
  auto sb = engine->submit(greedy(b, 30));  // must wait for a
  EXPECT_EQ(collect(sa).ids, fake_greedy(a, 30));
  EXPECT_EQ(collect(sb).ids, fake_greedy(b, 30));
}

TEST(EngineScheduler, ScriptedOutputReplacesSampling) {
  EngineOptions options;
  std::string scripted_text = "<tool_call>\n{\"name\": \"f\"}\n</tool_call>";
  options.scripted_outputs = {test_tokenizer()->encode(scripted_text)};
  auto [model, engine] = make_engine(limits(256, 1), options);
  GenerateRequest r = greedy(prompt_of(5, 24), 100);
  r.skip_special_tokens = false;
  Outcome out = collect(engine->submit(r));
  EXPECT_EQ(out.text, scripted_text);
  EXPECT_EQ(out.ids, options.scripted_outputs[0]);
  EXPECT_EQ(out.end.finish_reason, FinishReason::stop);
}

// An agent's turns: a tool call, then the answer, then the answer again for every request after.
TEST(EngineScheduler, ScriptsServeTheRequestsInTurnTheLastRepeating) {
  EngineOptions options;
  const std::vector<std::string> texts = {"<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "done", "bye"};
  for (const std::string& text : texts) options.scripted_outputs.push_back(test_tokenizer()->encode(text));
  auto [model, engine] = make_engine(limits(256, 1), options);
  for (size_t i = 0; i < texts.size() + 2; ++i) {
    GenerateRequest r = greedy(prompt_of(5 + i, 24), 100);
    r.skip_special_tokens = false;
    Outcome out = collect(engine->submit(r));
    EXPECT_EQ(out.text, texts[std::min(i, texts.size() - 1)]) << "request " << i;
    EXPECT_EQ(out.end.finish_reason, FinishReason::stop) << "request " << i;
  }
}

TEST(EngineScheduler, LogprobsComeWithEveryToken) {
  auto [model, engine] = make_engine(limits(256, 1));
  GenerateRequest r = greedy(prompt_of(5, 25), 4);
  r.sampling.top_logprobs = 3;
  Outcome out = collect(engine->submit(r));
  ASSERT_EQ(out.logprobs.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(out.logprobs[i].id, out.ids[i]);
    ASSERT_EQ(out.logprobs[i].top.size(), 3u);
    EXPECT_EQ(out.logprobs[i].top[0].first, out.ids[i]);  // greedy: the best is the chosen
    EXPECT_LT(out.logprobs[i].logprob, 0.0f);
    EXPECT_GT(out.logprobs[i].logprob, -0.1f);  // a clear favourite
  }
}

TEST(EngineScheduler, SeededSamplingIsReproducibleAcrossBatching) {
  auto [model, engine] = make_engine(limits(256, 2));
  auto sampled = [&](uint64_t seed) {
    GenerateRequest r = greedy(prompt_of(6, 26), 12);
    r.sampling.temperature = 5.0f;  // flat enough to pick runners-up
    r.sampling.seed = seed;
    return r;
  };
  auto s1 = engine->submit(sampled(3));
  auto s2 = engine->submit(greedy(prompt_of(9, 27), 12));  // shares the passes
  auto first = collect(s1).ids;
  collect(s2);
  EXPECT_EQ(collect(engine->submit(sampled(3))).ids, first);
  EXPECT_NE(first, fake_greedy(prompt_of(6, 26), 12));
}

TEST(EngineScheduler, ModelErrorsEndTheRequestsOfThatPass) {
  auto [model, engine] = make_engine(limits(256, 1));
  model->poison_token = 4321;
  Outcome bad = collect(engine->submit(greedy({1, 2, 4321}, 5)));
  EXPECT_EQ(bad.end.finish_reason, FinishReason::error);
  EXPECT_NE(bad.end.error.find("poisoned"), std::string::npos);
  Outcome good = collect(engine->submit(greedy({1, 2, 3}, 5)));
  EXPECT_EQ(good.ids, fake_greedy({1, 2, 3}, 5));
}

TEST(EngineScheduler, ShutdownAbortsPendingRequests) {
  auto [model, engine] = make_engine(limits(4096, 1));
  auto running = engine->submit(greedy(prompt_of(8, 28), 4000));
  auto waiting = engine->submit(greedy(prompt_of(8, 29), 4000));
  engine.reset();
  EXPECT_EQ(collect(running).end.finish_reason, FinishReason::abort);
  EXPECT_EQ(collect(waiting).end.finish_reason, FinishReason::abort);
}

}  // namespace
}  // namespace ellm
