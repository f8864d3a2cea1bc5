// The session store on the fake model (whose "KV" is the tokens themselves, so a wrong restore
// changes the output): the slot-choice regression of conversations that share a system prompt,
// tiers under small budgets, bad files, a failing disk, two servers on one directory, and a
// restart. Each runs on the plain fake model and on the fake hybrid one, whose sessions resume
// only at snapshots of its recurrent state (and whose output depends on that state).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/engine.h"
#include "engine/session_file.h"
#include "engine/session_store.h"
#include "engine_fake_model.h"
#include "engine_test_util.h"

namespace ellm {
namespace {

using testing::FakeModel;
using testing::fake_greedy;
using testing::FakeEngine;
using testing::make_engine;
namespace fs = std::filesystem;

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

class SessionStore : public ::testing::TestWithParam<bool> {
 protected:
  bool hybrid() const { return GetParam(); }
  FakeEngine make(ServingLimits limits, EngineOptions options = {}) { return make_engine(limits, options, hybrid()); }
  // RAM for `sessions` sessions of `tokens` tokens (the fake's KV is 4 bytes a token), with the
  // three snapshots a hybrid one keeps (where it ends, where its last turn ended, a shared one).
  size_t ram_for(int sessions, int tokens) const {
    return size_t(sessions) * (size_t(tokens) * sizeof(int32_t) + (hybrid() ? 3 * FakeModel::kStateBytes : 0));
  }
};

// The regression: a second conversation sharing only the system prompt used to overwrite the
// first one's slot, and then the two evicted each other on every turn (2.3% reuse).
TEST_P(SessionStore, AlternatingConversationsKeepTheirSessions) {
  for (int slots : {2, 4})
    for (int n : {2, 5}) {
      SCOPED_TRACE("slots " + std::to_string(slots) + ", conversations " + std::to_string(n));
      auto [model, engine] = make(limits(4096, slots));
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
TEST_P(SessionStore, ASharedSystemPromptIsComputedOnce) {
  auto [model, engine] = make(limits(4096, 4));
  auto conversations = sharing_a_system_prompt(6, 300);
  int64_t computed = 0;
  run_turns(*engine, conversations, 1, 30, 5, &computed);
  // The first computes 300 + 30; each other one its 30 new tokens, plus less than a block when
  // its match came from the store (matching goes by whole 64-token blocks there)... or nothing.
  // A hybrid model has no snapshot where the shared prompt ends until the second conversation
  // takes one there (computing it all again); the others resume from that snapshot.
  EXPECT_EQ(model->tokens_fed() - 6 * 4, computed);
  const int recomputing = hybrid() ? 1 : 0;
  EXPECT_LE(computed, (1 + recomputing) * 330 + (5 - recomputing) * (30 + 64));
  EXPECT_GE(engine->metrics().cached_tokens_total, (5 - recomputing) * 256);
  if (hybrid()) EXPECT_GE(engine->metrics().sessions.hot.snapshots_taken, 1);
}

// Agents arriving at once with one system prompt (or the n choices of one request): the later
// ones wait for the first one's prefill and copy its rows, so the prompt is computed once. (A
// hybrid model's prefill takes a snapshot where the shared prompt ends for them.) They queue
// up behind a slow pass of another request, so that one step admits them all.
TEST_P(SessionStore, AgentsArrivingTogetherComputeTheirSharedPromptOnce) {
  auto [model, engine] = make(limits(4096, 5));
  model->pass_delay_ms = 300;
  auto blocker = engine->submit(greedy(prompt_of(5, 1), 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto system = prompt_of(400, 77);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(system);
    auto tail = prompt_of(20, 100 + i);
    prompts.back().insert(prompts.back().end(), tail.begin(), tail.end());
    streams.push_back(engine->submit(greedy(prompts.back(), 5)));
  }
  collect(blocker);
  model->pass_delay_ms = 0;
  int64_t cached = 0;
  for (int i = 0; i < 4; ++i) {
    Outcome out = collect(streams[i]);
    EXPECT_EQ(out.ids, fake_greedy(prompts[i], 5));
    cached += out.end.cached_tokens;
  }
  EXPECT_EQ(cached, 3 * 400);
  EXPECT_EQ(model->tokens_fed(), 5 + 400 + 4 * 20 + 4 * 4);
}

// Chat templates drop earlier turns' reasoning, so the next turn's history re-renders the reply
// (here: the assistant tag, then the reply without the generation prompt's other tokens). A
// hybrid model then resumes where the history ended before that generation prompt: the server
// gives that position (history_end) and the prefill takes a snapshot there.
TEST_P(SessionStore, AReRenderedReplyResumesWhereTheHistoryEnded) {
  auto [model, engine] = make(limits(4096, 1));
  const std::vector<int32_t> generation_prompt = {4001, 4002, 4003};  // "assistant tag", "think", "end think"
  std::vector<int32_t> history = prompt_of(100, 5);
  int64_t previous_history = 0;  // where the last turn's history ended
  for (int turn = 0; turn < 4; ++turn) {
    auto user = prompt_of(30, 10 + turn);
    history.insert(history.end(), user.begin(), user.end());
    std::vector<int32_t> prompt = history;
    prompt.insert(prompt.end(), generation_prompt.begin(), generation_prompt.end());
    GenerateRequest request = greedy(prompt, 8);
    request.history_end = int64_t(history.size());
    Outcome out = collect(engine->submit(request));
    EXPECT_EQ(out.ids, fake_greedy(prompt, 8)) << "turn " << turn;
    if (turn > 0) EXPECT_GE(out.end.cached_tokens, previous_history) << "turn " << turn;
    previous_history = int64_t(history.size());
    history.push_back(generation_prompt[0]);
    history.insert(history.end(), out.ids.begin(), out.ids.end());
  }
  EXPECT_EQ(engine->metrics().recomputed_tokens_total, hybrid() ? 3 * 1 : 0)
      << "a hybrid model recomputes the assistant tag the history shares with the generation prompt";
}

// Small budgets: 8 conversations through 2 slots, a RAM tier that holds about two of them, and a
// disk tier: sessions move hot -> RAM -> disk and back, and the output never changes.
TEST_P(SessionStore, SessionsMoveBetweenTiersUnderSmallBudgets) {
  const std::string dir = temp_dir("tiers");
  EngineOptions options;
  options.session_memory_bytes = ram_for(2, 600);
  options.session_dir = dir;
  auto [model, engine] = make(limits(4096, 2), options);
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
TEST_P(SessionStore, WithoutADiskTierTheLeastRecentlyUsedAreDropped) {
  EngineOptions options;
  options.session_memory_bytes = ram_for(1, 700);
  auto [model, engine] = make(limits(4096, 1), options);
  auto conversations = sharing_a_system_prompt(4, 100);
  run_turns(*engine, conversations, 3, 50, 10);  // checks every reply
  SessionMetrics m = engine->metrics().sessions;
  EXPECT_GT(m.ram.evictions, 0);
  EXPECT_LE(m.ram.bytes, int64_t(options.session_memory_bytes));
}

// --session-dir survives a restart: the next turn of every conversation comes from disk.
TEST_P(SessionStore, SessionsSurviveARestart) {
  const std::string dir = temp_dir("restart");
  EngineOptions options;
  options.session_dir = dir;
  auto conversations = sharing_a_system_prompt(5, 150);
  {
    auto [model, engine] = make(limits(4096, 2), options);
    run_turns(*engine, conversations, 2, 40, 8);
    engine->shutdown(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  }
  auto [model, engine] = make(limits(4096, 2), options);
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

// Sessions that leave their slot for RAM are written through to --session-dir in the
// background, so a server killed without a shutdown (SIGKILL) loses only the last few seconds:
// the next server resumes them from disk.
TEST_P(SessionStore, RamSessionsAreWrittenThroughToDisk) {
  const std::string dir = temp_dir("through");
  EngineOptions options;
  options.session_dir = dir;  // and the default RAM tier, which holds them all
  auto conversations = sharing_a_system_prompt(4, 150);
  {
    auto [model, engine] = make(limits(4096, 1), options);
    run_turns(*engine, conversations, 1, 40, 8);  // three of the four leave the slot for RAM
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (engine->metrics().sessions.disk.sessions < 3 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_GE(engine->metrics().sessions.ram.sessions, 3);
    EXPECT_GE(engine->metrics().sessions.disk.sessions, 3);
  }  // no shutdown(): nothing is flushed
  auto [model, engine] = make(limits(4096, 1), options);
  for (int i = 0; i < 3; ++i) {
    Conversation& c = conversations[i];
    const int64_t before = int64_t(c.history.size());
    auto message = prompt_of(40, c.seed * 100 + 5);
    c.history.insert(c.history.end(), message.begin(), message.end());
    Outcome out = collect(engine->submit(greedy(c.history, 8)));
    EXPECT_EQ(out.ids, fake_greedy(c.history, 8));
    EXPECT_GE(out.end.cached_tokens, before - 1) << "conversation " << i;
  }
  EXPECT_GE(engine->metrics().sessions.disk.hits, 3);
  engine.reset();
  fs::remove_all(dir);
}

// Truncated, corrupt, foreign and stray files are skipped (or fail their restore) with a log
// line: never a crash, never wrong output.
TEST_P(SessionStore, BadFilesAreSkippedAndNeverYieldWrongOutput) {
  const std::string dir = temp_dir("bad");
  EngineOptions options;
  options.session_dir = dir;
  auto conversations = sharing_a_system_prompt(3, 300);
  {
    auto [model, engine] = make(limits(4096, 1), options);
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
  auto [model, engine] = make(limits(4096, 1), options);
  for (Conversation& c : conversations) {
    auto message = prompt_of(40, c.seed * 100 + 9);
    c.history.insert(c.history.end(), message.begin(), message.end());
    Outcome out = collect(engine->submit(greedy(c.history, 8)));
    EXPECT_EQ(out.ids, fake_greedy(c.history, 8)) << "seed " << c.seed;
    EXPECT_EQ(out.end.finish_reason, FinishReason::length);
  }
  // Another model's files (another fingerprint) are skipped too.
  auto model2 = std::make_unique<FakeModel>(test_tokenizer()->vocab_size(), limits(4096, 1), hybrid());
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
TEST_P(SessionStore, AFailingDiskDropsSessionsAndServingGoesOn) {
  const std::string dir = temp_dir("full");
  EngineOptions options;
  options.session_memory_bytes = ram_for(1, 300);
  options.session_dir = dir;
  std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  rlimit tiny = old;
  tiny.rlim_cur = 512;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &tiny), 0);
  {
    auto [model, engine] = make(limits(4096, 1), options);
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
TEST_P(SessionStore, TwoServersShareOneDirectory) {
  const std::string dir = temp_dir("shared");
  EngineOptions options;
  options.session_memory_bytes = 0;  // straight to disk
  options.session_dir = dir;
  auto a = make(limits(4096, 1), options);
  auto b = make(limits(4096, 1), options);
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

// The file format on its own: a prefix restore reads whole chunks and checks them; snapshots of
// a recurrent state are read one at a time and checked; a damaged state, an old version or
// another model is refused with the reason.
TEST(SessionFile, RoundTripAndPrefixRestore) {
  const std::string dir = temp_dir("file");
  KvIdentity id{1, 2, 3, 8, 100};
  const int64_t n = 600;
  std::vector<int32_t> tokens = prompt_of(int(n), 5);
  std::vector<std::vector<uint8_t>> data(3, std::vector<uint8_t>(n * 8));
  for (size_t r = 0; r < 3; ++r)
    for (size_t i = 0; i < data[r].size(); ++i) data[r][i] = uint8_t(i * 7 + r * 13);
  std::vector<std::span<const uint8_t>> ranges(data.begin(), data.end());
  std::vector<StateSnapshot> snapshots;
  for (int64_t position : {int64_t(256), n}) {
    StateSnapshot s{position, new_state_buffer(100), false};
    for (int i = 0; i < 100; ++i) s.state[i] = uint8_t(position + i);
    snapshots.push_back(s);
  }
  const std::string name = session_file_name(id, tokens, snapshots);
  EXPECT_NE(name, session_file_name(id, tokens, std::span(snapshots).first(1))) << "names tell snapshot sets apart";
  write_session_file(dir, name, id, tokens, ranges, snapshots);
  const std::string path = dir + "/" + name;
  std::string why;
  auto info = read_session_info(path, id, why);
  ASSERT_TRUE(info) << why;
  EXPECT_EQ(info->tokens, tokens);
  EXPECT_EQ(info->snapshots, (std::vector<int64_t>{256, n}));
  for (int64_t end : {int64_t(256), int64_t(512), n}) {
    std::vector<std::vector<uint8_t>> back(3, std::vector<uint8_t>(n * 8));
    std::vector<std::span<uint8_t>> dst(back.begin(), back.end());
    ASSERT_TRUE(read_session_kv(path, id, end, dst, why)) << why;
    for (size_t r = 0; r < 3; ++r)
      EXPECT_TRUE(std::equal(back[r].begin(), back[r].begin() + end * 8, data[r].begin()));
  }
  std::vector<uint8_t> state(100);
  for (const StateSnapshot& s : snapshots) {
    ASSERT_TRUE(read_session_state(path, id, s.position, state.data(), why)) << why;
    EXPECT_TRUE(std::equal(state.begin(), state.end(), s.state.get()));
  }
  EXPECT_FALSE(read_session_state(path, id, 300, state.data(), why));
  EXPECT_NE(why.find("no snapshot at position 300"), std::string::npos) << why;

  KvIdentity other = id;
  other.fingerprint = 9;
  EXPECT_FALSE(read_session_info(path, other, why));
  EXPECT_NE(why.find("another model"), std::string::npos) << why;
  other = id;
  other.state_bytes = 50;
  EXPECT_FALSE(read_session_info(path, other, why));
  EXPECT_NE(why.find("another KV format"), std::string::npos) << why;
  other = id;  // written by an FP16 cache, read by an FP8 one: both dtypes named
  other.kv_dtype = uint64_t(KvDtype::fp8);
  EXPECT_FALSE(read_session_info(path, other, why));
  EXPECT_NE(why.find("KV cache dtype fp16 in the file, fp8 here"), std::string::npos) << why;

  // A flipped byte in the first state: its restore is refused; the last one still reads.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-150, std::ios::end);
    f.put('\x5a');
  }
  EXPECT_FALSE(read_session_state(path, id, 256, state.data(), why));
  EXPECT_NE(why.find("corrupt state"), std::string::npos) << why;
  EXPECT_TRUE(read_session_state(path, id, n, state.data(), why)) << why;

  // Files of the previous formats (versions 1 to 3; 3 did not record the KV dtype) are skipped,
  // saying so.
  for (const uint32_t version : {1u, 2u, 3u}) {
    {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(8);
      f.write(reinterpret_cast<const char*>(&version), 4);
    }
    EXPECT_FALSE(read_session_info(path, id, why));
    EXPECT_NE(why.find("another version (" + std::to_string(version) + ")"), std::string::npos) << why;
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(FakeModels, SessionStore, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "hybrid" : "plain"); });

}  // namespace
}  // namespace ellm
