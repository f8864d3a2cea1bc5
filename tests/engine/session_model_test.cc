// The session store on the real tiny models, on every tier this machine has: output computed
// from KV restored from RAM, from disk, or copied from another conversation's shared prefix is
// identical to output computed from scratch, greedy and with a fixed seed. The hybrid models
// resume from snapshots of their recurrent state (at the end of the last turn, at the end of the
// shared system prompt); their greedy output equals the output from scratch wherever the margin
// is clear (engine_test_util.h, expect_same_at_clear_margins).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "base/cpu.h"
#include "engine/engine.h"
#include "engine_test_util.h"
#include "test_helpers.h"
#include "model/model.h"
#include "text/tokenizer/tokenizer.h"
#include "tiers_under_test.h"

namespace ellm {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Engine> make_engine(const std::string& model, int64_t slots, EngineOptions options,
                                    KvDtype kv = KvDtype::f16) {
  ServingLimits limits;
  limits.kv_dtype = kv;
  limits.sequence_length = 1024;
  limits.batch_size = slots;
  limits.threads = 1;
  options.eos_token_ids = kEos;
  return std::make_unique<Engine>(Model::load(ELLM_SHARED "/models/" + model, limits), test_tokenizer(), options);
}

std::vector<int32_t> encode(const std::string& text) { return test_tokenizer()->encode(text); }

struct Case {
  std::string model;
  std::string tier;  // where restores come from: "ram" or "disk"
  KvDtype kv = KvDtype::f16;
};

class SessionModel : public ::testing::TestWithParam<Case> {};

bool hybrid(const Case& c) {
  return c.model.find("qwen35") != std::string::npos || c.model.find("qwen4exp") != std::string::npos;
}

// out against the reference: the same tokens (a hybrid model's: up to a near-tie of the reference).
void expect_same_output(const Case& c, const Outcome& out, const Outcome& reference, const std::string& what) {
  if (hybrid(c))
    expect_same_at_clear_margins(c.model, out, reference, what);
  else
    EXPECT_EQ(out.ids, reference.ids) << what;
}

TEST_P(SessionModel, RestoredOutputEqualsOutputFromScratch) {
  const Case c = GetParam();
  const std::string dir = fs::temp_directory_path().string() + "/ellm-session-model-" + std::to_string(getpid());
  for (Isa isa : test::tiers_under_test()) {
    SCOPED_TRACE(std::string("tier ") + isa_name(isa));
    set_active_isa(isa);
    fs::remove_all(dir);
    EngineOptions options;
    if (c.tier == "disk") {
      options.session_memory_bytes = 0;  // every session that leaves its slot goes to disk
      options.session_dir = dir;
    }
    auto engine = make_engine(c.model, 1, options, c.kv);  // one slot: conversations take turns in it
    EngineOptions cold_options;
    cold_options.session_cache = false;
    auto cold = make_engine(c.model, 1, cold_options, c.kv);

    std::string system = "<|im_start|>system\nYou are a careful assistant. Answer in short sentences and "
                         "cite the tool output you used.";
    for (int i = 0; i < 6; ++i) system += " Tool " + std::to_string(i) + ": looks things up in the index.";
    system += "<|im_end|>\n";
    std::vector<std::vector<int32_t>> history(3);
    for (int turn = 0; turn < 3; ++turn)
      for (int conv = 0; conv < 3; ++conv) {
        auto message = encode("<|im_start|>user\nQuestion " + std::to_string(turn) + " from user " +
                              std::to_string(conv) + ": what now?<|im_end|>\n<|im_start|>assistant\n");
        if (turn == 0) history[conv] = encode(system);
        history[conv].insert(history[conv].end(), message.begin(), message.end());
        GenerateRequest request = greedy(history[conv], 6);
        request.ignore_eos = true;
        request.sampling.top_logprobs = 2;  // the margins of the reference
        // A fixed seed; not for a hybrid model, whose logits after a resume are equal only
        // within the golden tolerance, which may move a sample across a threshold.
        if (conv == 1 && !hybrid(c)) {
          request.sampling.temperature = 0.9f;
          request.sampling.seed = 1234 + turn;
        }
        Outcome out = collect(engine->submit(request));
        request.use_session_cache = false;
        Outcome reference = collect(cold->submit(request));
        expect_same_output(c, out, reference, "turn " + std::to_string(turn) + " conversation " + std::to_string(conv));
        if (turn > 0) EXPECT_GT(out.end.cached_tokens, int64_t(history[conv].size()) - 40);
        history[conv].insert(history[conv].end(), out.ids.begin(), out.ids.end());
      }
    SessionMetrics m = engine->metrics().sessions;
    EXPECT_GT(m.hot.hits, 0) << "the shared system prompt reused in the slot";
    EXPECT_GT(c.tier == "disk" ? m.disk.hits : m.ram.hits, 0);
    if (hybrid(c)) {
      EXPECT_GT(m.hot.snapshots_taken, 0) << "where the shared system prompt ends";
      EXPECT_GT(c.tier == "disk" ? m.disk.snapshots_restored : m.ram.snapshots_restored, 0);
    }
    engine.reset();
  }
  set_active_isa(best_isa());
  fs::remove_all(dir);
}

// Shared-prefix copies between slots: a conversation starts from a copy of another slot's rows.
TEST_P(SessionModel, ASharedPrefixCopiedFromAnotherSlotGivesTheSameOutput) {
  const Case c = GetParam();
  if (c.tier != "ram") GTEST_SKIP() << "slot-to-slot copies do not touch the store's tiers";
  for (Isa isa : test::tiers_under_test()) {
    SCOPED_TRACE(std::string("tier ") + isa_name(isa));
    set_active_isa(isa);
    auto engine = make_engine(c.model, 3, {}, c.kv);
    EngineOptions cold_options;
    cold_options.session_cache = false;
    auto cold = make_engine(c.model, 1, cold_options, c.kv);
    std::string system = "<|im_start|>system\nShared instructions for every agent.";
    for (int i = 0; i < 8; ++i) system += " Rule " + std::to_string(i) + ": be exact.";
    for (int conv = 0; conv < 3; ++conv) {
      auto prompt = encode(system + "<|im_end|>\n<|im_start|>user\nAgent " + std::to_string(conv) +
                           " asks.<|im_end|>\n<|im_start|>assistant\n");
      GenerateRequest request = greedy(prompt, 6);
      request.ignore_eos = true;
      request.sampling.top_logprobs = 2;
      Outcome out = collect(engine->submit(request));
      request.use_session_cache = false;
      expect_same_output(c, out, collect(cold->submit(request)), "conversation " + std::to_string(conv));
      // A hybrid model's second conversation computes the shared prompt again (no snapshot
      // where it ends yet) and takes one there; the third resumes from it.
      if (conv > (hybrid(c) ? 1 : 0)) EXPECT_GT(out.end.cached_tokens, 60) << "conversation " << conv;
    }
    EXPECT_GE(engine->metrics().sessions.hot.bytes_in, 1) << "rows were copied between slots";
  }
  set_active_isa(best_isa());
}

// A session saved with one KV dtype is never resumed by a server with another: the file is
// skipped with a log line naming both, and the prompt is computed.
TEST(SessionModelKvDtype, FilesOfAnotherKvDtypeAreSkipped) {
  const std::string dir = fs::temp_directory_path().string() + "/ellm-session-dtype-" + std::to_string(getpid());
  for (auto [saved, serving] : {std::pair{KvDtype::f16, KvDtype::fp8}, std::pair{KvDtype::fp8, KvDtype::f16}}) {
    fs::remove_all(dir);
    EngineOptions options;
    options.session_memory_bytes = 0;
    options.session_dir = dir;
    std::string text = "<|im_start|>user\nA question long enough to be worth a session file:";
    for (int i = 0; i < 12; ++i) text += " part " + std::to_string(i) + " of the question.";
    const auto prompt = encode(text + "<|im_end|>\n<|im_start|>assistant\n");
    {
      auto engine = make_engine("tiny-qwen3", 1, options, saved);
      collect(engine->submit(greedy(prompt, 4)));
      collect(engine->submit(greedy(encode("Another user's question takes the only slot, so the first "
                                           "session goes to disk."), 4)));
      engine->shutdown(std::chrono::steady_clock::now() + std::chrono::seconds(10));
    }
    ASSERT_FALSE(fs::is_empty(dir));
    auto engine = make_engine("tiny-qwen3", 1, options, serving);
    EXPECT_EQ(engine->metrics().sessions.disk.sessions, 0) << kv_dtype_name(saved) << " file, " << kv_dtype_name(serving) << " server";
    EngineOptions cold_options;
    cold_options.session_cache = false;
    auto cold = make_engine("tiny-qwen3", 1, cold_options, serving);
    auto request = greedy(prompt, 4);
    Outcome out = collect(engine->submit(request));
    EXPECT_EQ(out.end.cached_tokens, 0);
    request.use_session_cache = false;
    EXPECT_EQ(out.ids, collect(cold->submit(request)).ids);
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, SessionModel,
                         ::testing::Values(Case{"tiny-qwen3", "ram"}, Case{"tiny-qwen3", "disk"},
                                           Case{"tiny-qwen3-moe", "ram"}, Case{"tiny-qwen3-moe", "disk"},
                                           Case{"tiny-qwen35", "ram"}, Case{"tiny-qwen35", "disk"},
                                           Case{"tiny-qwen35-moe", "ram"}, Case{"tiny-qwen35-moe", "disk"},
                                           Case{"tiny-qwen4exp", "ram"}, Case{"tiny-qwen4exp", "disk"},
                                           Case{"tiny-qwen3", "ram", KvDtype::fp8},
                                           Case{"tiny-qwen3", "disk", KvDtype::fp8},
                                           Case{"tiny-qwen35", "disk", KvDtype::fp8}),
                         [](const auto& info) {
                           return test::model_test_name(
                               info.param.model + "_" + info.param.tier +
                               (info.param.kv == KvDtype::f16 ? "" : std::string("_") + kv_dtype_name(info.param.kv)));
                         });

}  // namespace
}  // namespace ellm
