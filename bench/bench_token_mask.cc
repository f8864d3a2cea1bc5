// Constrained decoding cost per token (engine/token_mask.h) over the real Qwen3 vocabulary: each
// benchmark replays a recorded output of a schema (random tokens among the allowed ones, so
// strings, numbers, keys and closing all occur), computing the mask over the 151k logits and
// accepting the token at every step. Against two limits: 100 us a token, and a batch-1 decode
// step of Qwen3-0.6B, taken at its floor: its 1.19 GB of BF16 weights read at the read bandwidth
// measured in this run (a real step is slower, so the fraction shown is an upper bound). Steps are
// timed in the thread's CPU time, so other processes on a shared machine do not inflate them.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <ctime>
#include <random>

#include "base/threads.h"
#include "grammar/token_mask.h"
#include "text/tokenizer/tokenizer.h"
#include "tools/machine_limits.h"

namespace ellm {
namespace {

using nlohmann::json;

const std::shared_ptr<const VocabIndex>& vocab() {
  static auto v = std::make_shared<const VocabIndex>(*Tokenizer::load(std::string(ELLM_SHARED) + "/text/qwen3"));
  return v;
}

// Seconds of the floor of a Qwen3-0.6B decode step: 28 layers of q/k/v/o and MLP products and
// the tied lm_head, BF16, read at the measured bandwidth.
double decode_step_floor() {
  static double seconds = [] {
    ThreadTeam team(2, /*pin=*/true, /*adaptive=*/false);
    const double layer = 4096.0 * 1024 + 1024.0 * 2048 + 6144.0 * 1024 + 1024.0 * 3072;
    const double bytes = 2 * (28 * layer + 151936.0 * 1024);
    return bytes / measure_read_bandwidth(team, read_probe_bytes(), 3);
  }();
  return seconds;
}

double thread_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

struct Case {
  const char* name;
  std::shared_ptr<const Grammar> (*grammar)();
  int64_t budget;
};

const json kTools = json::parse(R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
    "city":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer"}},"required":["city","unit"]}}},
  {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{
    "query":{"type":"string"},"limit":{"type":"integer"}},"required":["query"]}}}])");

const Case kCases[] = {
    {"flat", [] { return compile_json_schema(json::parse(R"({"type":"object","properties":{"name":{"type":"string"},
        "age":{"type":"integer"},"email":{"type":"string","maxLength":40},"active":{"type":"boolean"}},
        "required":["name","age","email","active"]})")); }, 200},
    {"nested_arrays_enums", [] { return compile_json_schema(json::parse(R"({"type":"object","properties":{
        "items":{"type":"array","maxItems":4,"items":{"type":"object","properties":{"sku":{"type":"string","pattern":"[A-Z]{3}-[0-9]{4}"},
        "qty":{"type":"integer"},"color":{"enum":["red","green","blue"]}},"required":["sku","qty","color"]}},
        "note":{"anyOf":[{"type":"string"},{"type":"null"}]}},"required":["items","note"]})")); }, 200},
    {"json_object", [] { return json_object_grammar(); }, 200},
    // The slow path: a broad pattern and keys that may be listed or additional walk the trie.
    {"pattern_and_additional_keys", [] { return compile_json_schema(json::parse(R"({"type":"object","properties":{
        "id":{"type":"string","pattern":"[a-z0-9 ]{1,30}"},"n":{"type":"integer"}},"required":["id"],
        "additionalProperties":{"type":"integer"}})")); }, 120},
    {"tool_call_qwen3", [] { return compile_tool_calls(kTools, ToolCallStyle::hermes, "", 2); }, 200},
    {"tool_call_qwen3_coder", [] { return compile_tool_calls(kTools, ToolCallStyle::qwen3_coder, "", 2); }, 200},
};

// A recorded output: random allowed tokens until the grammar completes or the budget ends.
std::vector<int32_t> record(const Case& c) {
  OutputConstraint spec;
  spec.grammar = c.grammar();
  TokenConstraint constraint(spec, vocab(), {});
  std::vector<float> logits(size_t(vocab()->vocab_size()));
  std::mt19937_64 rng(7);
  std::vector<int32_t> tokens;
  for (int64_t remaining = c.budget; remaining > 0 && !constraint.finished(); --remaining) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    if (!constraint.mask(logits, remaining)) break;
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < int32_t(logits.size()); ++id)
      if (logits[size_t(id)] == 0.0f) allowed.push_back(id);
    tokens.push_back(allowed[rng() % allowed.size()]);
    constraint.accept(tokens.back());
  }
  return tokens;
}

void BM_mask(benchmark::State& state, const Case* c) {
  const std::vector<int32_t> tokens = record(*c);
  OutputConstraint spec;
  spec.grammar = c->grammar();
  std::vector<float> logits(size_t(vocab()->vocab_size()), 0.0f);
  double seconds = 0, worst = 0;
  int64_t steps = 0;
  for (auto _ : state) {
    state.PauseTiming();
    TokenConstraint constraint(spec, vocab(), {});
    state.ResumeTiming();
    for (size_t i = 0; i < tokens.size(); ++i) {
      double start = thread_seconds();
      constraint.mask(logits, c->budget - int64_t(i));
      constraint.accept(tokens[i]);
      double step = thread_seconds() - start;
      seconds += step;
      worst = std::max(worst, step);
    }
    steps += int64_t(tokens.size());
  }
  const double per_token = seconds / double(steps);
  state.counters["tokens"] = double(tokens.size());
  state.counters["us_per_token"] = per_token * 1e6;
  state.counters["worst_us"] = worst * 1e6;
  state.counters["of_100us"] = per_token / 100e-6;
  state.counters["decode_floor_ms"] = decode_step_floor() * 1e3;
  state.counters["of_decode_step"] = per_token / decode_step_floor();
}

void BM_vocab_index(benchmark::State& state) {
  auto tokenizer = Tokenizer::load(std::string(ELLM_SHARED) + "/text/qwen3");
  for (auto _ : state) benchmark::DoNotOptimize(VocabIndex(*tokenizer));
}

int register_all() {
  for (const Case& c : kCases)
    benchmark::RegisterBenchmark((std::string("mask/") + c.name).c_str(), BM_mask, &c)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("vocab_index_build", BM_vocab_index)->Unit(benchmark::kMillisecond)->Iterations(3);
  return 0;
}
const int registered = register_all();

}  // namespace
}  // namespace ellm

BENCHMARK_MAIN();
