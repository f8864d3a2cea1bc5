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
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/load/mapped_table.h"
#include "engine/request.h"
#include "engine/session_store.h"
#include "engine/proposer.h"

namespace ellm {

class Model;
class Tokenizer;

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
  // A prefill that would stop the generating slots longer than this runs in parts, with their
  // decode steps in between (Model::begin_pass); 0 = never.
  double max_decode_stall_seconds = 0.5;
  std::vector<int32_t> eos_token_ids;  // from generation_config.json
  SamplingParams default_sampling;     // from generation_config.json
  bool session_cache = true;  // false: no request reuses cached KV, and no session is stored
  // max_tokens beyond what the context (or the KV budget) leaves after the prompt: false
  // shortens the completion to fit, and it ends with finish_reason "length" when the context
  // fills (llama.cpp's server); true refuses the request with a 400 (vLLM, OpenAI).
  bool strict_max_tokens = false;
  // The session store beyond the slots (engine/session_store.h).
  size_t session_memory_bytes = size_t(1) << 30;  // RAM tier
  std::string session_dir;                        // disk tier; "" = off
  size_t session_disk_bytes = size_t(64) << 30;   // disk tier
  // Hybrid models: a prompt's prefill takes a snapshot of the recurrent state every this many
  // positions (0: none), where another conversation sharing its start may resume.
  int64_t state_snapshot_interval = 4096;
  // Testing hook: when non-empty, requests "sample" these scripts' tokens in order, then stop as
  // at eos, so output parsing and agent turns can be tested end to end deterministically. The
  // first request to start takes the first script, the next the second, and so on; the last
  // script serves every request after.
  std::vector<std::vector<int32_t>> scripted_outputs;
  // Testing hook: the scheduler waits this long before each scripted token, so a stream's
  // tokens come apart at a pace its reader keeps up with (a slow reader gets them merged).
  double scripted_token_seconds = 0;
  // Speculative decoding (engine/proposer.h): the proposer of requests that do not name one,
  // and the most tokens a stream proposes per pass (0: no speculative decoding; the model must
  // be loaded with ServingLimits::speculative_tokens at least this). Streams propose fewer
  // when fewer are kept, and a pass carries at most speculative_pass_rows next tokens and
  // proposals together (more only when more slots decode), so that it stays about as cheap as
  // a decode step.
  Proposer speculative = Proposer::none;
  int64_t num_speculative_tokens = 0;
  int64_t speculative_pass_rows = 16;
  // The vision tower's rows of recent images, by content (ImageRowCache); 0 = none kept.
  size_t image_cache_bytes = size_t(512) << 20;
};

struct QueueFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct EngineMetrics {
  int64_t requests_running = 0, requests_waiting = 0;
  int64_t prompt_tokens_total = 0, generation_tokens_total = 0, cached_tokens_total = 0;
  // Prompt tokens held in a session but prefilled again: a hybrid model resumes only at a
  // snapshot of its recurrent state, which may lie before the end of what is held.
  int64_t recomputed_tokens_total = 0;
  int64_t requests_finished_total = 0;
  size_t kv_resident_bytes = 0, kv_budget_bytes = 0;
  size_t kv_bytes_per_token = 0;     // one position of one slot, all layers, in kv_dtype
  const char* kv_dtype = "fp16";     // --kv-cache-dtype (kv_dtype_name)
  // Latency histograms (seconds): bucket upper bounds and cumulative counts, Prometheus style.
  struct Histogram {
    std::vector<double> bounds;
    std::vector<int64_t> counts;  // counts[i] = observations <= bounds[i]; last = +Inf
    double sum = 0;
    int64_t count = 0;
  };
  Histogram time_to_first_token, inter_token_latency, e2e_latency;
  SessionMetrics sessions;
  // Speculative decoding, per proposer: checks (groups of proposals checked), tokens proposed,
  // of those the tokens kept, and the time spent proposing (a draft model's or MTP's passes).
  struct Speculative {
    int64_t checks = 0, proposed = 0, accepted = 0;
    double propose_seconds = 0;
  };
  Speculative speculative[int(Proposer::count)];
  // Images in admitted requests, and of those the ones the vision tower encoded (the others'
  // pads were all in the session cache).
  int64_t images_total = 0, images_encoded_total = 0, image_cache_hits_total = 0;
  size_t image_cache_bytes = 0;
  MappedTableStatus mapped_table;  // a table the model reads in place (Qwen3.8-Flash-Next's n-gram table)
};

class Engine {
 public:
  // `draft`: the draft model of speculative decoding (Proposer::draft), loaded to share the
  // model's thread team (Model::load's share_threads).
  Engine(std::unique_ptr<Model> model, std::shared_ptr<const Tokenizer> tokenizer,
         EngineOptions options, std::unique_ptr<Model> draft = nullptr);
  ~Engine();  // stops the scheduler; pending requests finish with "abort"

  // Validates and queues. Throws RequestError for a request that can never run (an empty
  // prompt, prompt + max_tokens beyond the sequence length, ids outside the vocabulary, bad
  // sampling values), QueueFull when the queue is full. The only place requests are checked.
  std::shared_ptr<RequestStream> submit(GenerateRequest request);

  EngineMetrics metrics() const;
  // The cached sessions of every tier (hot: in a slot), and dropping them (admin routes).
  std::vector<SessionInfo> list_sessions();
  int64_t drop_sessions();
  // Stops taking requests, ends running ones ("abort"), and writes the sessions held in slots
  // and RAM to the disk tier (--session-dir) until the deadline. Call once, before destruction.
  void shutdown(std::chrono::steady_clock::time_point deadline);
  // What the server needs of the model and its tokenizer.
  int64_t sequence_length() const;
  // The model's <|image_pad|> id when it has a vision tower, else -1.
  int32_t image_token_id() const;
  // A hybrid model with the session cache: sessions resume at snapshots of its state, so a
  // request's GenerateRequest::history_end is worth finding.
  bool resumes_at_snapshots() const;
  const SamplingParams& default_sampling() const;  // generation_config.json
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;
  bool is_token(int32_t id) const;         // the tokenizer has it (the model's rows may be more)
  std::string token_text(int32_t id) const;  // its bytes; "" for ids without a token

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ellm
