#pragma once
// A request inside the scheduler: queued (QueuedRequest, made by Engine::submit) until it is
// placed in a slot, then running there (ActiveRequest) until it ends.
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/prompt_images.h"
#include "engine/proposer.h"
#include "engine/request.h"
#include "engine/speculative_depth.h"
#include "engine/stop.h"
#include "grammar/token_mask.h"
#include "text/tokenizer/detokenizer.h"

namespace ellm {

using Clock = std::chrono::steady_clock;

inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct QueuedRequest {
  GenerateRequest request;
  std::shared_ptr<RequestStream> stream;
  int64_t max_new = 0;  // max_tokens resolved against the sequence length
  Clock::time_point submitted;
  std::unique_ptr<TokenConstraint> constraint;  // made at submit when the request has one
  Proposer proposer = Proposer::none;  // speculative decoding
  int speculative_depth = 0;
};

// A position where a hybrid model's pass is to take a snapshot of a slot's state.
struct PlannedSnapshot {
  int64_t position;
  bool shared;  // where another session's prefix ends
};

// A request that owns a slot.
struct ActiveRequest {
  GenerateRequest request;
  std::shared_ptr<RequestStream> stream;
  std::vector<int32_t> sequence;  // prompt, then generated tokens; the slot holds KV of a prefix
  int64_t prompt_len = 0, max_new = 0, generated = 0, cached = 0;
  IncrementalDetokenizer detokenizer;
  StopStringMatcher stop;
  std::unique_ptr<TokenConstraint> constraint;
  const std::vector<int32_t>* script = nullptr;  // EngineOptions::scripted_outputs: emitted instead of sampling
  std::vector<PlannedSnapshot> snapshots;  // hybrid models: snapshots its prefill takes, by position
  RequestImages images;
  Proposer proposer = Proposer::none;
  SpeculativeDepth depth;  // how many tokens it proposes
  Clock::time_point submitted, last_token;

  ActiveRequest(const Tokenizer& tokenizer, QueuedRequest&& queued, int64_t cached_tokens);
};

}  // namespace ellm
