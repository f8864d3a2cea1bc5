#pragma once
// The engine's vocabulary, shared with the server: what a request asks for, what comes back,
// why it ended, and why it was refused.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"

namespace ellm {

enum class FinishReason { stop, length, abort, error };
// "stop", "length", "abort", "error": the OpenAI / vLLM names.
const char* finish_reason_name(FinishReason reason);

// A request the engine can never run (Engine::submit): `param` names the request field at
// fault, as OpenAI errors do ("messages" for the prompt, "max_tokens", "temperature", ...).
struct RequestError : Error {
  RequestError(std::string param, const std::string& message) : Error(message), param(std::move(param)) {}
  std::string param;
};

struct OutputConstraint;  // grammar/token_mask.h: a grammar the output must follow

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;
  int top_k = 0;             // 0 or -1 = off
  float min_p = 0.0f;
  std::optional<uint64_t> seed;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int top_logprobs = -1;     // -1 = no logprobs; 0..20 = chosen token + that many alternatives
};

// An image in a prompt (Qwen3.5+ with a vision tower): its run of <|image_pad|> tokens, one per
// merged 2x2 patch block, and the preprocessed patches the tower turns into their embeddings.
struct PromptImage {
  int64_t first = 0;  // the index of its first <|image_pad|> in the prompt
  int64_t grid_t = 1, grid_h = 0, grid_w = 0;  // in patches
  int64_t merged_h = 0, merged_w = 0;          // the token grid: merged_h * merged_w pads
  std::shared_ptr<const std::vector<float>> pixel_values;  // [grid_t * grid_h * grid_w][patch floats]
  uint64_t content_hash = 0;  // of the pixels: the image's identity in the session cache
  int64_t n_tokens() const { return merged_h * merged_w; }
};

struct GenerateRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = -1;          // -1 = until the slot's sequence limit
  std::vector<std::string> stop;    // stop strings, never emitted
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool use_session_cache = true;
  // Where the conversation so far ends in the prompt (before the generation prompt; 0: not
  // known). A hybrid model snapshots its state there: the next turn re-renders the reply that
  // follows (templates drop earlier turns' reasoning), so it resumes there.
  int64_t history_end = 0;
  // Where the leading system messages end in the prompt (0: not known): the prefix that
  // conversations with the same system prompt and tools share. A hybrid model snapshots its
  // state there too, so the next conversation that starts the same way resumes there.
  int64_t system_end = 0;
  // Constrained decoding (response_format, tool_choice); shared by the n choices of a request,
  // each of which gets its own decoding state at submit.
  std::shared_ptr<const OutputConstraint> constraint;
  // Speculative decoding: "ngram", "mtp", "draft" or "none" ("": the server's choice), and the
  // most tokens to propose per pass (-1: the server's).
  std::string speculative;
  int64_t num_speculative_tokens = -1;
  // In prompt order. Engine::submit gives each image's pads ids of its own (outside the
  // vocabulary, from the content hash) so that sessions match images by content.
  std::vector<PromptImage> images;
};

struct TokenLogprob {
  int32_t id;
  float logprob;
  std::vector<std::pair<int32_t, float>> top;  // best alternatives, best first
};

// One event of a request: a text delta (possibly empty text with new ids), or the end. The end
// event carries no text or ids, only the reason and the counts; every request gets exactly one.
// Stop tokens (eos, stop_token_ids) and stop strings never appear in text or ids, but a stop
// token counts in completion_tokens.
struct StreamEvent {
  std::string text;                  // newly completed text (never a broken UTF-8 character)
  std::vector<int32_t> ids;          // tokens generated since the previous event
  std::vector<TokenLogprob> logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::stop;  // when finished
  std::string error;                 // message when finish_reason is error
  std::string stop_sequence;         // when finished: the stop string that ended it, if one did
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;  // set when finished
};

}  // namespace ellm
