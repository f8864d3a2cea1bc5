#pragma once
// The scheduler thread: continuous batching over the model's slots. Each step admits waiting
// requests to idle slots (session-cache aware, within the KV budget), builds one pass of
// decode tokens for every generating slot plus pending prefill, runs model.forward once, then
// samples, applies stop rules and streams text for every slot whose logits came back.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "base/worker.h"
#include "engine/drafter.h"
#include "engine/engine.h"
#include "engine/sampling.h"
#include "engine/session_store.h"
#include "engine/slots.h"
#include "engine/stop.h"
#include "grammar/token_mask.h"
#include "model/model.h"
#include "text/tokenizer/tokenizer.h"

namespace ellm {

using Clock = std::chrono::steady_clock;

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
struct PlannedCapture {
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
  std::vector<PlannedCapture> captures;  // hybrid models: snapshots its prefill takes, by position
  Proposer proposer = Proposer::none;
  SpeculationControl speculation;  // how many tokens it proposes
  Clock::time_point submitted, last_token;

  ActiveRequest(const Tokenizer& tokenizer, QueuedRequest&& queued, int64_t cached_tokens);
};

class Scheduler {
 public:
  Scheduler(Model& model, const Tokenizer& tokenizer, const EngineOptions& options,
            std::unique_ptr<Model> draft = nullptr);
  ~Scheduler();  // stops the thread; every request still queued or running ends with "abort"

  // Queues a validated request; throws QueueFull beyond max_queue waiting requests.
  void enqueue(QueuedRequest request);
  EngineMetrics metrics() const;
  std::vector<SessionInfo> list_sessions();
  int64_t drop_sessions();
  // Stops the loop (running and queued requests end with "abort"), then writes the sessions in
  // slots and in RAM to the disk tier until the deadline. The scheduler takes no requests after.
  void shutdown(Clock::time_point deadline);

 private:
  struct PassPart {  // one slot's share of a pass
    int slot;
    int64_t count;  // tokens fed
    bool logits;    // its last token wants logits
    int64_t proposed = 0;  // speculative: its next token, then this many proposed ones, each with logits
  };

  void loop();
  void step();
  void drop_cancelled();
  void admit();
  enum class Placement { placed, wait, defer };
  Placement place(QueuedRequest& queued);
  std::vector<PlannedCapture> plan_captures(int64_t reuse, int64_t common, int64_t history_end,
                                            int64_t reusable) const;
  void copy_from_slot(Slot& slot, int source, int64_t reuse);
  void restore_state(Slot& slot, const StateSnapshot* snapshot, int source, int64_t position);
  void restore_in_background(Slot& slot, QueuedRequest&& queued, RestorePlan plan, int64_t reserve,
                             int64_t common, std::vector<PlannedCapture> captures);
  void finish_restores();
  void occupy(Slot& slot, int64_t reserve);
  void start(Slot& slot, QueuedRequest&& queued, int64_t reuse, int64_t common,
             std::vector<PlannedCapture> captures);
  void save(const Slot& slot, int64_t keep);
  void forget(Slot& slot);
  void drop_snapshots(Slot& slot, int64_t above);
  void evict(Slot& slot);
  bool make_room(int chosen, int keep, int64_t need);
  void stop_thread();
  void add_decode_tokens(std::vector<BatchToken>& batch, std::vector<PassPart>& parts);
  void build_pass();
  void add_proposals(size_t n_decode);
  void check_proposals(const PassPart& part, size_t first_row);
  void run_pass();
  bool run_in_parts();
  void decode_between_parts();
  void take_results(std::span<const PassPart> parts);
  void keep_captures(int slot);
  void fail_parts(std::span<const PassPart> parts, const std::string& error);
  int32_t on_logits(int slot, std::span<float> logits, int32_t proposal = -1);
  void end_at_stop_token(int slot);
  void finish(int slot, FinishReason reason, const std::string& error = {});
  void abort_all();
  void fail_running(const std::string& error);
  void publish_metrics();

  Model& model_;
  const Tokenizer& tokenizer_;
  const EngineOptions options_;
  const int64_t sequence_length_, vocab_size_, chunk_size_, budget_positions_;

  // Scheduler thread only.
  std::vector<Slot> slots_;
  std::vector<std::unique_ptr<ActiveRequest>> active_;  // [slot], null when idle
  std::vector<Sampler> samplers_;                       // [slot]
  std::vector<BatchToken> batch_;
  std::vector<PassPart> parts_;
  // A long prefill runs in parts when slots are generating (EngineOptions::max_decode_stall_seconds);
  // their decode steps run in between, from these.
  bool in_parts_ = false;
  std::vector<BatchToken> step_batch_;
  std::vector<PassPart> step_parts_;
  // Measured (all layers); at first a slow CPU's, so that the first part of the first long
  // prefill is short rather than seconds long.
  double prefill_seconds_per_token_ = 20e-3;
  double decode_step_seconds_ = 0;        // measured
  bool pass_has_prefill_ = false;
  // Speculative decoding: per slot its proposals for this pass; the draft proposers; scratch.
  std::vector<std::vector<int32_t>> proposals_;  // [slot][num_speculative_tokens]
  std::unique_ptr<Drafter> drafter_;
  std::vector<DraftJob> draft_jobs_;
  std::vector<int> depth_, granted_;
  std::vector<double> rate_;
  std::vector<BatchToken> spec_batch_;
  std::vector<float> logits_;  // [batch_size][vocab]
  std::unique_ptr<SessionStore> store_;  // null without the session cache
  std::vector<std::span<uint8_t>> kv_from_, kv_to_, state_from_, state_to_;
  std::vector<std::span<const uint8_t>> kv_out_;
  // Hybrid models: the snapshot bytes, what one costs in KV positions under --kv-memory, and
  // the snapshots the pass being run captures (slot, snapshot).
  const bool hybrid_;
  const size_t state_bytes_;
  const int64_t snapshot_positions_;
  std::vector<std::pair<int, StateSnapshot>> captures_;
  // Requests whose prefix the restorer (below) is copying from the store into their slots.
  struct PendingRestore {
    QueuedRequest queued;
    int slot = -1;
    int64_t reserve = 0, common = 0;
    std::vector<PlannedCapture> captures;
    RestorePlan plan;
    std::vector<std::span<uint8_t>> kv, state;  // the slot's ranges, committed on this thread
    std::vector<StateSnapshot> inherited;
    int64_t restored = 0;
    Clock::time_point start;
    bool done = false;  // under mutex_
  };
  std::vector<std::unique_ptr<PendingRestore>> restoring_;
  uint64_t clock_ = 0;
  int running_ = 0;
  size_t scripts_started_ = 0;
  EngineMetrics local_metrics_;
  Clock::time_point last_kv_measure_;

  // Shared with submitters and metrics readers.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<QueuedRequest> queue_;
  int idle_slots_ = 0;
  int64_t placing_ = 0;  // taken off the queue by admit() and not yet placed or put back
  bool placed_in_slot_ = false;  // admit()'s request took its slot (occupy), so no longer counts in placing_
  bool admit_blocked_ = false;  // the queue's head waits for a slot: no use stepping for it
  bool restores_done_ = false;  // a restore finished: its request may start
  bool stopping_ = false;
  bool drop_hot_ = false;
  EngineMetrics metrics_;
  std::vector<SessionInfo> hot_sessions_;

  std::thread thread_;
  Worker restorer_;  // last: stops first, while what its jobs touch is still there
};

}  // namespace ellm
