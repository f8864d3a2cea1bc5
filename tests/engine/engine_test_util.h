#pragma once
// Shared pieces of the engine tests: the real tokenizer, requests, limits, and reading a
// request's whole stream.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"
#include "text/tokenizer/tokenizer.h"

namespace ellm {

// Both tiny models share the real Qwen3 tokenizer.
inline const std::shared_ptr<const Tokenizer>& test_tokenizer() {
  static auto tok = Tokenizer::load(ELLM_SHARED "/models/tiny-qwen3");
  return tok;
}

inline ServingLimits limits(int64_t sequence_length, int64_t batch_size, int64_t chunk_size = 0,
                            size_t kv_memory_bytes = 0) {
  ServingLimits l;
  l.sequence_length = sequence_length;
  l.batch_size = batch_size;
  l.chunk_size = chunk_size;
  l.kv_memory_bytes = kv_memory_bytes;
  return l;
}

// n ordinary-text token ids, different for each seed.
inline std::vector<int32_t> prompt_of(int n, int seed) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(2000 + (seed * 131 + i * 17) % 5000);
  return p;
}

inline GenerateRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

struct Outcome {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<TokenLogprob> logprobs;
  StreamEvent end;
  int events = 0;
};

// Reads events until the end event; a stream that goes quiet for 60 s fails the test.
inline Outcome collect(const std::shared_ptr<RequestStream>& stream) {
  Outcome out;
  for (;;) {
    std::optional<StreamEvent> event = stream->next(60000);
    if (!event) {
      ADD_FAILURE() << "stream went quiet without an end event";
      return out;
    }
    ++out.events;
    if (event->finished) {
      EXPECT_TRUE(event->text.empty() && event->ids.empty()) << "end events carry no tokens";
      out.end = std::move(*event);
      return out;
    }
    out.text += event->text;
    out.ids.insert(out.ids.end(), event->ids.begin(), event->ids.end());
    out.logprobs.insert(out.logprobs.end(), event->logprobs.begin(), event->logprobs.end());
  }
}

}  // namespace ellm
