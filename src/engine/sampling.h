#pragma once
// Turning one row of logits into the next token: penalties, temperature, top-k, top-p, min-p,
// a seeded draw, and the raw model's log-probabilities. Free functions over spans, plus a
// per-slot Sampler that owns every scratch buffer so a token costs no allocation.
//
// Order (as vLLM): repetition / presence / frequency penalties on the logits, then temperature,
// then top-k, top-p (over the top-k renormalised), min-p, then the draw. temperature 0, or any
// value that is not a positive number, means greedy argmax over the penalised logits.
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/request.h"

namespace ellm {

// Index of the largest logit; ties go to the lowest id; NaNs are never chosen unless all are.
int32_t argmax(std::span<const float> logits);

// HF semantics: every id in `context_ids` (prompt + generated, each id once) has its logit
// divided by `penalty` when positive, multiplied when negative.
void apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> context_ids,
                              float penalty);

// OpenAI semantics over generated tokens: logit -= count * frequency + (count > 0) * presence.
// `generated_ids` lists each generated id once; `counts[id]` is how often it was generated.
void apply_presence_frequency(std::span<float> logits, std::span<const int32_t> generated_ids,
                              std::span<const int32_t> counts, float presence, float frequency);

// Draws from softmax(logits / temperature) restricted by top_k / top_p / min_p. Both scratch
// spans need logits.size() entries. Deterministic for a given rng state. temperature > 0.
int32_t sample_filtered(std::span<const float> logits, float temperature, int top_k, float top_p,
                        float min_p, std::mt19937_64& rng, std::span<int32_t> id_scratch,
                        std::span<float> weight_scratch);

// Speculative decoding, for a proposer that offers one token: `proposal` with its probability
// under the distribution sample_filtered draws from, else a draw from that distribution
// without it. The result is distributed exactly as sample_filtered's (the standard rejection
// rule with a point-mass proposal). Same scratch as sample_filtered.
int32_t sample_or_accept(std::span<const float> logits, float temperature, int top_k, float top_p,
                         float min_p, int32_t proposal, std::mt19937_64& rng,
                         std::span<int32_t> id_scratch, std::span<float> weight_scratch);

// Log-softmax of the raw logits at `chosen` plus the `top_n` most likely ids, best first.
void raw_logprobs(std::span<const float> logits, int32_t chosen, int top_n,
                  std::span<int32_t> scratch, TokenLogprob& out);

// One slot's sampling state for one request at a time, sized once for the vocabulary.
class Sampler {
 public:
  Sampler(int64_t vocab_size, int64_t max_context);

  // Starts a request: seeds the RNG (random when no seed), resets the penalty counts.
  void start(const SamplingParams& params, std::span<const int32_t> prompt);
  // Picks the next token from the raw logits (not modified). With a proposal (speculative
  // decoding, >= 0): greedy takes the argmax as ever; sampling keeps the proposal or replaces
  // it by sample_or_accept's rule, so the token has exactly the distribution it would without.
  int32_t sample(std::span<const float> logits, int32_t proposal = -1);
  // Records a generated token for the penalties.
  void accept(int32_t token);
  // Fills out with the raw log-probabilities of `chosen` (params.top_logprobs alternatives).
  void logprobs(std::span<const float> logits, int32_t chosen, TokenLogprob& out);


 private:
  bool has_penalties() const;
  void mark_context(int32_t id);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> generated_count_;  // [vocab]
  std::vector<uint8_t> in_context_;       // [vocab] id occurs in prompt or generated
  std::vector<int32_t> context_ids_;      // ids with in_context_ set, each once
  std::vector<int32_t> generated_ids_;    // ids with generated_count_ > 0, each once
  std::vector<float> work_;               // [vocab] penalised logits
  std::vector<float> weights_;            // [vocab] unnormalised probabilities
  std::vector<int32_t> scratch_;          // [vocab] candidate ids
};

}  // namespace ellm
