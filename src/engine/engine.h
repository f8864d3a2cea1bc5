#pragma once
// The engine: slots over the model's static KV cache, a scheduler thread that runs continuous
// batching steps (decode tokens of every generating slot + pending prefill in one pass), the
// session cache (a new request reuses the idle slot sharing its longest token prefix), sampling,
// stop rules and incremental detokenisation. It knows nothing of HTTP: the server submits
// GenerateRequests and reads each request's events from its RequestStream.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/session_store.h"

namespace ellm {

class Model;
class Tokenizer;

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

struct GenerateRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = -1;          // -1 = until the slot's sequence limit
  std::vector<std::string> stop;    // stop strings, never emitted
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool use_session_cache = true;
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
  std::string finish_reason;         // "stop", "length", "abort" or "error" when finished
  std::string error;                 // message when finish_reason == "error"
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;  // set when finished
};

// The server's handle on one request. The engine pushes, the server pops; cancel() makes the
// engine stop the request and free its slot within one step. A slow reader never slows the
// engine or grows the queue: a text event pushed while another still waits is merged into it,
// so at most one text event and the end event are ever queued.
class RequestStream {
 public:
  // Blocks up to timeout_ms for the next event; returns nullopt on timeout.
  std::optional<StreamEvent> next(int timeout_ms);
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  // Engine side; never blocks on the reader.
  void push(StreamEvent event);
  size_t queued() const;  // events waiting to be read

 private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<StreamEvent> events_;
  std::atomic<bool> cancelled_{false};
};

struct EngineOptions {
  int64_t max_queue = 64;  // requests waiting for a slot beyond this get QueueFull
  std::vector<int32_t> eos_token_ids;  // from generation_config.json
  SamplingParams default_sampling;     // from generation_config.json
  bool session_cache = true;  // false: no request reuses cached KV, and no session is stored
  // The session store beyond the slots (engine/session_store.h).
  size_t session_memory_bytes = size_t(1) << 30;  // RAM tier
  std::string session_dir;                        // disk tier; "" = off
  size_t session_disk_bytes = size_t(64) << 30;   // disk tier
  // Testing hook: when non-empty, every request "samples" these tokens in order, then stops
  // as at eos, so output parsing can be tested end to end deterministically.
  std::vector<int32_t> scripted_output;
};

struct QueueFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct EngineMetrics {
  int64_t requests_running = 0, requests_waiting = 0;
  int64_t prompt_tokens_total = 0, generation_tokens_total = 0, cached_tokens_total = 0;
  int64_t requests_finished_total = 0;
  size_t kv_resident_bytes = 0, kv_budget_bytes = 0;
  // Latency histograms (seconds): bucket upper bounds and cumulative counts, Prometheus style.
  struct Histogram {
    std::vector<double> bounds;
    std::vector<int64_t> counts;  // counts[i] = observations <= bounds[i]; last = +Inf
    double sum = 0;
    int64_t count = 0;
  };
  Histogram time_to_first_token, inter_token_latency, e2e_latency;
  SessionMetrics sessions;
};

class Engine {
 public:
  Engine(std::unique_ptr<Model> model, std::shared_ptr<const Tokenizer> tokenizer,
         EngineOptions options);
  ~Engine();  // stops the scheduler; pending requests finish with "abort"

  // Validates and queues. Throws Error for a request that can never run (prompt + max_tokens
  // beyond the sequence length, ids outside the vocabulary), QueueFull when the queue is full.
  std::shared_ptr<RequestStream> submit(GenerateRequest request);

  EngineMetrics metrics() const;
  // The cached sessions of every tier (hot: in a slot), and dropping them (admin routes).
  std::vector<SessionInfo> list_sessions();
  int64_t drop_sessions();
  // Stops taking requests, ends running ones ("abort"), and writes the sessions held in slots
  // and RAM to the disk tier (--session-dir) until the deadline. Call once, before destruction.
  void shutdown(std::chrono::steady_clock::time_point deadline);
  const Model& model() const;
  const Tokenizer& tokenizer() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ellm
