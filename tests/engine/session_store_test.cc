// The session store on the fake model (whose "KV" is the tokens themselves, so a wrong restore
// changes the output): the slot-choice regression of conversations that share a system prompt,
// tiers under small budgets, bad files, a failing disk, two servers on one directory, and a
// restart.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "engine/engine.h"
#include "engine/session_file.h"
#include "engine/session_store.h"
#include "engine_fake_model.h"
#include "engine_test_util.h"

namespace ellm {
namespace {

using testing::FakeModel;
using testing::fake_greedy;
namespace fs = std::filesystem;

struct FakeEngine {
  FakeModel* model;
  std::unique_ptr<Engine> engine;
};

FakeEngine make_engine(ServingLimits limits, EngineOptions options = {}) {
  auto model = std::make_unique<FakeModel>(test_tokenizer()->vocab_size(), limits);
  FakeModel* raw = model.get();
  options.eos_token_ids = {151645, 151643};
  return {raw, std::make_unique<Engine>(std::move(model), test_tokenizer(), options)};
}

std::string temp_dir(const std::string& name) {
  std::string dir = fs::temp_directory_path().string() + "/ellm-sessions-" + name + "-" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A conversation as a client keeps it: the whole history resent every turn.
struct Conversation {
  std::vector<int32_t> history;
  int seed;
};

// Runs `turns` round-robin turns of the conversations (each: history + a new user message of
// `user` tokens, then the reply appended) and checks every reply against the model's rule.
// Returns the fraction of the reusable prompt tokens (the previous turn's history) served from
// the cache after each conversation's first turn.
double run_turns(Engine& engine, std::vector<Conversation>& conversations, int turns, int user,
                 int reply, int64_t* computed = nullptr) {
  int64_t reusable = 0, cached = 0;
  for (int turn = 0; turn < turns; ++turn)
    for (Conversation& c : conversations) {
      const int64_t before = int64_t(c.history.size());
      auto message = prompt_of(user, c.seed * 100 + turn);
      c.history.insert(c.history.end(), message.begin(), message.end());
      Outcome out = collect(engine.submit(greedy(c.history, reply)));
      EXPECT_EQ(out.ids, fake_greedy(c.history, reply)) << "turn " << turn << " seed " << c.seed;
      if (turn > 0) {
        reusable += before;
        cached += out.end.cached_tokens;
      }
      if (computed) *computed += out.end.prompt_tokens - out.end.cached_tokens;
      c.history.insert(c.history.end(), out.ids.begin(), out.ids.end());
    }
  return reusable ? double(cached) / double(reusable) : 1.0;
}

std::vector<Conversation> sharing_a_system_prompt(int n, int system_tokens) {
  std::vector<Conversation> out;
  auto system = prompt_of(system_tokens, 999);
  for (int i = 0; i < n; ++i) out.push_back({system, i + 1});
  return out;
}

// The regression: a second conversation sharing only the system prompt used to overwrite the
// first one's slot, and then the two evicted each other on every turn (2.3% reuse).
TEST(SessionStore, AlternatingConversationsKeepTheirSessions) {
  for (int slots : {2, 4})
    for (int n : {2, 5}) {
      SCOPED_TRACE("slots " + std::to_string(slots) + ", conversations " + std::to_string(n));
      auto [model, engine] = make_engine(limits(4096, slots));
      auto conversations = sharing_a_system_prompt(n, 200);
      double reuse = run_turns(*engine, conversations, 4, 40, 12);
      // Every previous turn is reused but for the last reply token, which the client's
      // history holds but whose KV was never written (it was sampled, not fed).
      EXPECT_GT(reuse, 0.97);
      EngineMetrics m = engine->metrics();
      if (n > slots) EXPECT_GT(m.sessions.ram.hits, 0) << "more conversations than slots go through RAM";
    }
}

// N conversations with one system prompt compute it once: the others copy its KV.
TEST(SessionStore, ASharedSystemPromptIsComputedOnce) {
  auto [model, engine] = make_engine(limits(4096, 4));
  auto conversations = sharing_a_system_prompt(6, 300);
  int64_t computed = 0;
  run_turns(*engine, conversations, 1, 30, 5, &computed);
  // The first computes 300 + 30; each other one its 30 new tokens, plus less than a block when
  // its match came from the store (matching goes by whole 64-token blocks there)... or nothing.
  EXPECT_EQ(model->tokens_fed() - 6 * 4, computed);
  EXPECT_LE(computed, 330 + 5 * 30 + 5 * 64);
  EXPECT_GE(engine->metrics().cached_tokens_total, 5 * 256);
}

// Agents arriving at once with one system prompt (or the n choices of one request): the later
// ones wait for the first one's prefill and copy its rows, so the prompt is computed once.
TEST(SessionStore, AgentsArrivingTogetherComputeTheirSharedPromptOnce) {
  auto [model, engine] = make_engine(limits(4096, 4));
  auto system = prompt_of(400, 77);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(system);
    auto tail = prompt_of(20, 100 + i);
    prompts.back().insert(prompts.back().end(), tail.begin(), tail.end());
    streams.push_back(engine->submit(greedy(prompts.back(), 5)));
  }
  int64_t cached = 0;
  for (int i = 0; i < 4; ++i) {
    Outcome out = collect(streams[i]);
    EXPECT_EQ(out.ids, fake_greedy(prompts[i], 5));
    cached += out.end.cached_tokens;
  }
  EXPECT_EQ(cached, 3 * 400);
  EXPECT_EQ(model->tokens_fed(), 400 + 4 * 20 + 4 * 4);
}

// Small budgets: 8 conversations through 2 slots, a RAM tier that holds about two of them, and a
// disk tier: sessions move hot -> RAM -> disk and back, and the output never changes.
TEST(SessionStore, SessionsMoveBetweenTiersUnderSmallBudgets) {
  const std::string dir = temp_dir("tiers");
  EngineOptions options;
  options.session_memory_bytes = 2 * 600 * sizeof(int32_t);  // the fake KV: 4 bytes a token
  options.session_dir = dir;
  auto [model, engine] = make_engine(limits(4096, 2), options);
  auto conversations = sharing_a_system_prompt(8, 100);
  double reuse = run_turns(*engine, conversations, 4, 50, 10);
  EXPECT_GT(reuse, 0.97);
  SessionMetrics m = engine->metrics().sessions;
  EXPECT_GT(m.ram.hits, 0);
  EXPECT_GT(m.disk.hits, 0) << "the RAM tier is too small to hold them all";
  EXPECT_GT(m.ram.evictions, 0);
  EXPECT_GT(m.disk.bytes_out, 0);
  EXPECT_LE(m.ram.bytes, int64_t(options.session_memory_bytes) * 5 / 4);
  engine.reset();
  fs::remove_all(dir);
}

// Without a disk tier, sessions beyond the RAM budget are dropped (counted) and serving goes on.
TEST(SessionStore, WithoutADiskTierTheLeastRecentlyUsedAreDropped) {
  EngineOptions options;
  options.session_memory_bytes = 700 * sizeof(int32_t);
  auto [model, engine] = make_engine(limits(4096, 1), options);
  auto conversations = sharing_a_system_prompt(4, 100);
  run_turns(*engine, conversations, 3, 50, 10);  // checks every reply
  SessionMetrics m = engine->metrics().sessions;
  EXPECT_GT(m.ram.evictions, 0);
  EXPECT_LE(m.ram.bytes, int64_t(options.session_memory_bytes));
}

// --session-dir survives a restart: the next turn of every conversation comes from disk.
TEST(SessionStore, SessionsSurviveARestart) {
  const std::string dir = temp_dir("restart");
  EngineOptions options;
  options.session_dir = dir;
  auto conversations = sharing_a_system_prompt(5, 150);
  {
    auto [model, engine] = make_engine(limits(4096, 2), options);
    run_turns(*engine, conversations, 2, 40, 8);
    engine->shutdown(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  }
  auto [model, engine] = make_engine(limits(4096, 2), options);
  int64_t fed = 0;
  for (Conversation& c : conversations) {
    const int64_t before = int64_t(c.history.size());
    auto message = prompt_of(40, c.seed * 100 + 7);
    c.history.insert(c.history.end(), message.begin(), message.end());
    const int64_t fed_before = model->tokens_fed();
    Outcome out = collect(engine->submit(greedy(c.history, 8)));
    EXPECT_EQ(out.ids, fake_greedy(c.history, 8));
    EXPECT_GE(out.end.cached_tokens, before - 1) << "seed " << c.seed;
    fed += model->tokens_fed() - fed_before;
  }
  EXPECT_GE(engine->metrics().sessions.disk.hits, 5);
  engine.reset();
  fs::remove_all(dir);
}

// Truncated, corrupt, foreign and stray files are skipped (or fail their restore) with a log
// line: never a crash, never wrong output.
TEST(SessionStore, BadFilesAreSkippedAndNeverYieldWrongOutput) {
  const std::string dir = temp_dir("bad");
  EngineOptions options;
  options.session_dir = dir;
  auto conversations = sharing_a_system_prompt(3, 300);
  {
    auto [model, engine] = make_engine(limits(4096, 1), options);
    run_turns(*engine, conversations, 1, 40, 8);
    engine->shutdown(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  }
  std::vector<fs::path> files;
  for (const auto& item : fs::directory_iterator(dir)) files.push_back(item.path());
  ASSERT_GE(files.size(), 3u);
  std::sort(files.begin(), files.end());
  // One truncated, one with a flipped KV byte, one with a flipped header byte.
  fs::resize_file(files[0], fs::file_size(files[0]) - 100);
  for (auto [path, from_end] : {std::pair{files[1], 10}, std::pair{files[2], -20}}) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(from_end > 0 ? -from_end : -from_end, from_end > 0 ? std::ios::end : std::ios::beg);
    char c = 0;
    f.read(&c, 1);
    f.seekp(f.tellg() - std::streamoff(1));
    c ^= 0x5a;
    f.write(&c, 1);
  }
  std::ofstream(dir + "/garbage.kv") << "not a session";
  std::ofstream(dir + "/.tmp-123-half-written") << "partial";

  options.session_memory_bytes = 0;  // every restore must come from disk
  auto [model, engine] = make_engine(limits(4096, 1), options);
  for (Conversation& c : conversations) {
    auto message = prompt_of(40, c.seed * 100 + 9);
    c.history.insert(c.history.end(), message.begin(), message.end());
    Outcome out = collect(engine->submit(greedy(c.history, 8)));
    EXPECT_EQ(out.ids, fake_greedy(c.history, 8)) << "seed " << c.seed;
    EXPECT_EQ(out.end.finish_reason, FinishReason::length);
  }
  // Another model's files (another fingerprint) are skipped too.
  auto model2 = std::make_unique<FakeModel>(test_tokenizer()->vocab_size(), limits(4096, 1));
  model2->fingerprint_ = 7;
  Engine other(std::move(model2), test_tokenizer(), options);
  EXPECT_EQ(other.metrics().sessions.disk.sessions, 0);
  Outcome out = collect(other.submit(greedy(conversations[0].history, 4)));
  EXPECT_EQ(out.end.cached_tokens, 0);
  EXPECT_EQ(out.ids, fake_greedy(conversations[0].history, 4));
  engine.reset();
  fs::remove_all(dir);
}

// A disk that cannot be written (a file size limit makes every write fail, as a full disk
// would): the sessions are dropped and counted, and serving goes on.
TEST(SessionStore, AFailingDiskDropsSessionsAndServingGoesOn) {
  const std::string dir = temp_dir("full");
  EngineOptions options;
  options.session_memory_bytes = 300 * sizeof(int32_t);
  options.session_dir = dir;
  std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  rlimit tiny = old;
  tiny.rlim_cur = 512;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &tiny), 0);
  {
    auto [model, engine] = make_engine(limits(4096, 1), options);
    auto conversations = sharing_a_system_prompt(4, 100);
    run_turns(*engine, conversations, 3, 50, 10);  // checks every reply
    engine->shutdown(std::chrono::steady_clock::now() + std::chrono::seconds(10));
    SessionMetrics m = engine->metrics().sessions;
    EXPECT_GT(m.disk.failures, 0);
    EXPECT_EQ(m.disk.sessions, 0);
  }
  setrlimit(RLIMIT_FSIZE, &old);
  for (const auto& item : fs::directory_iterator(dir))
    ADD_FAILURE() << "left behind: " << item.path();
  fs::remove_all(dir);
}

// Two servers on one directory: each restores what the other wrote, and neither corrupts the
// other's files (content-addressed names, atomic renames).
TEST(SessionStore, TwoServersShareOneDirectory) {
  const std::string dir = temp_dir("shared");
  EngineOptions options;
  options.session_memory_bytes = 0;  // straight to disk
  options.session_dir = dir;
  auto a = make_engine(limits(4096, 1), options);
  auto b = make_engine(limits(4096, 1), options);
  auto conversations = sharing_a_system_prompt(4, 128);
  // Conversations alternate between the servers, as after a failover; both write at once.
  for (int turn = 0; turn < 4; ++turn) {
    std::vector<std::thread> clients;
    for (size_t i = 0; i < conversations.size(); ++i)
      clients.emplace_back([&, i] {
        Conversation& c = conversations[i];
        Engine& engine = (i + turn) % 2 ? *a.engine : *b.engine;
        const int64_t before = int64_t(c.history.size());
        auto message = prompt_of(70, c.seed * 100 + turn);
        c.history.insert(c.history.end(), message.begin(), message.end());
        Outcome out = collect(engine.submit(greedy(c.history, 6)));
        EXPECT_EQ(out.ids, fake_greedy(c.history, 6));
        c.history.insert(c.history.end(), out.ids.begin(), out.ids.end());
        (void)before;
      });
    for (auto& t : clients) t.join();
  }
  SessionMetrics ma = a.engine->metrics().sessions, mb = b.engine->metrics().sessions;
  EXPECT_GT(ma.disk.hits + mb.disk.hits, 0);
  EXPECT_EQ(ma.disk.failures + mb.disk.failures, 0);
  a.engine.reset();
  b.engine.reset();
  fs::remove_all(dir);
}

// The file format on its own: a prefix restore reads whole chunks and checks them.
TEST(SessionFile, RoundTripAndPrefixRestore) {
  const std::string dir = temp_dir("file");
  KvIdentity id{1, 2, 3, 8};
  const int64_t n = 600;
  std::vector<int32_t> tokens = prompt_of(int(n), 5);
  std::vector<std::vector<uint8_t>> data(3, std::vector<uint8_t>(n * 8));
  for (size_t r = 0; r < 3; ++r)
    for (size_t i = 0; i < data[r].size(); ++i) data[r][i] = uint8_t(i * 7 + r * 13);
  std::vector<std::span<const uint8_t>> ranges(data.begin(), data.end());
  const std::string name = session_file_name(id, tokens);
  write_session_file(dir, name, id, tokens, ranges);
  std::string why;
  auto info = read_session_info(dir + "/" + name, id, why);
  ASSERT_TRUE(info) << why;
  EXPECT_EQ(info->tokens, tokens);
  for (int64_t end : {int64_t(256), int64_t(512), n}) {
    std::vector<std::vector<uint8_t>> back(3, std::vector<uint8_t>(n * 8));
    std::vector<std::span<uint8_t>> dst(back.begin(), back.end());
    ASSERT_TRUE(read_session_kv(dir + "/" + name, id, end, dst, why)) << why;
    for (size_t r = 0; r < 3; ++r)
      EXPECT_TRUE(std::equal(back[r].begin(), back[r].begin() + end * 8, data[r].begin()));
  }
  KvIdentity other = id;
  other.fingerprint = 9;
  EXPECT_FALSE(read_session_info(dir + "/" + name, other, why));
  EXPECT_NE(why.find("another model"), std::string::npos) << why;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ellm
