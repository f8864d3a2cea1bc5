#pragma once
// Shared pieces of the engine tests: the real tokenizer, requests, limits, and reading a
// request's whole stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"
#include "text/tokenizer/tokenizer.h"

namespace ellm {

// The end-of-turn tokens of both tiny models' generation_config.json.
inline const std::vector<int32_t> kEos = {151645, 151643};

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

// The logits a plain model gives the tokens after `prompt` in `sequence` (one row per token after
// the prompt), fed as one pass into one slot.
inline std::vector<float> plain_logits(const std::string& model, const std::vector<int32_t>& sequence,
                                       size_t prompt) {
  ServingLimits limits;
  limits.sequence_length = int64_t(sequence.size()) + 1;
  limits.threads = 1;
  auto plain = Model::load(ELLM_SHARED "/models/" + model, limits);
  std::vector<BatchToken> batch;
  for (size_t p = 0; p + 1 < sequence.size(); ++p) batch.push_back({sequence[p], 0, int32_t(p), p + 1 >= prompt});
  std::vector<float> logits((sequence.size() - prompt) * size_t(plain->vocab_size()));
  plain->forward(batch, logits.data());
  return logits;
}

inline nlohmann::json golden_session(const std::string& model) {
  std::ifstream file(ELLM_SHARED "/golden/" + model + "/session.json");
  return nlohmann::json::parse(file);
}

// A hybrid model's logits depend, within the golden tolerance, on how its passes were cut (the
// chunked delta rule and the recurrence round differently), so output computed after a resume
// may differ from a run from scratch at a near-tie. What must hold: `got` equals `reference` up
// to the first step where the reference's own top-1 margin is below the golden margin_min. The
// reference must carry top_logprobs of at least 2.
inline void expect_same_at_clear_margins(const std::string& model, const Outcome& got, const Outcome& reference,
                                         const std::string& what) {
  const double margin_min = golden_session(model)["margin_min"];
  ASSERT_EQ(reference.logprobs.size(), reference.ids.size()) << what << ": the reference needs logprobs";
  for (size_t i = 0; i < reference.ids.size() && i < got.ids.size(); ++i) {
    if (got.ids[i] == reference.ids[i]) continue;
    const auto& top = reference.logprobs[i].top;
    ASSERT_GE(top.size(), 2u) << what << ": the reference needs top_logprobs >= 2";
    EXPECT_LE(top[0].second - top[1].second, margin_min) << what << ": token " << i << " differs at a clear margin";
    return;  // the paths part at a near-tie
  }
  EXPECT_EQ(got.ids.size(), reference.ids.size()) << what;
}

}  // namespace ellm
