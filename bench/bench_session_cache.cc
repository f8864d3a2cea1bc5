// Time to first token of turn k in a growing conversation, with the session cache on and off.
// Each turn resends the whole history plus 500 new tokens, as OpenAI clients do. With the cache
// a turn prefills only its new tokens, so its TTFT stays flat; without it TTFT grows with the
// history. Counters t1..t8 are each turn's TTFT in milliseconds.
//
//   ELLM_BENCH_MODEL=<model folder> (default: shared/models/tiny-qwen3), ELLM_BENCH_TURNS=8
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "engine/engine.h"
#include "model/model.h"
#include "text/tokenizer/tokenizer.h"

namespace {

using namespace ellm;

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

void BM_SessionCacheTTFT(benchmark::State& state) {
  const bool use_cache = state.range(0) != 0;
  const std::string dir = env_or("ELLM_BENCH_MODEL", ELLM_SHARED "/models/tiny-qwen3");
  const int turns = std::stoi(env_or("ELLM_BENCH_TURNS", "8"));
  const int new_tokens = 500, reply_tokens = 16;

  ServingLimits limits;
  limits.sequence_length = turns * (new_tokens + reply_tokens) + 64;
  limits.batch_size = 1;
  auto tokenizer = Tokenizer::load(dir);
  Engine engine(Model::load(dir, limits), tokenizer, EngineOptions{});

  for (auto _ : state) {
    std::vector<int32_t> history;
    for (int turn = 1; turn <= turns; ++turn) {
      for (int i = 0; i < new_tokens; ++i) history.push_back(1000 + (turn * 7919 + i * 104729) % 50000);
      GenerateRequest request;
      request.prompt = history;
      request.max_tokens = reply_tokens;
      request.sampling.temperature = 0;
      request.ignore_eos = true;
      request.use_session_cache = use_cache;
      auto start = std::chrono::steady_clock::now();
      auto stream = engine.submit(request);
      double ttft_ms = -1;
      for (;;) {
        auto event = stream->next(600000);
        if (!event) {
          state.SkipWithError("stream timed out");
          return;
        }
        if (ttft_ms < 0 && !event->ids.empty())
          ttft_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        if (event->finished) break;
        history.insert(history.end(), event->ids.begin(), event->ids.end());
      }
      state.counters["t" + std::to_string(turn)] = ttft_ms;
    }
  }
}
BENCHMARK(BM_SessionCacheTTFT)->ArgName("cache")->Arg(1)->Arg(0)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
