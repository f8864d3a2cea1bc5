#pragma once
// The scheduler thread: continuous batching over the model's slots. Each step admits waiting
// requests to idle slots (session-cache aware, within the KV budget), builds one pass of
// decode tokens for every generating slot plus pending prefill, runs model.forward once, then
// samples, applies stop rules and streams text for every slot whose logits came back.
//
// Its code, by concern:
//   scheduler.cc       the thread and its step, the public calls, a request's end, metrics
//   placement.cc       admitting a queued request to a slot: where its prefix comes from (a
//                      slot, or the store on the restorer thread), and starting it there
//   pass.cc            building a pass and running it (in parts when a prefill would stall
//                      the decoding slots), speculative proposals and their check
//   images.cc          the images a pass will need, encoded before it in the tower's stages,
//                      with the decoding slots' steps in between
//   slot_sessions.*    the slots' sessions under the KV budget: saved, evicted, copied in
//   request_output.*   a request's way out: logits → constraint → sampler → stop → text → stream
//   requests.h         a request queued, and running in a slot
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/worker.h"
#include "engine/draft_proposer.h"
#include "engine/engine.h"
#include "engine/sampling.h"
#include "engine/scheduler/request_output.h"
#include "engine/scheduler/requests.h"
#include "engine/scheduler/slot_sessions.h"
#include "engine/session_store.h"
#include "engine/slots.h"
#include "engine/snapshot.h"
#include "model/model.h"

namespace ellm {

class Tokenizer;

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

  // scheduler.cc
  void loop();
  void step();
  void drop_cancelled();
  void stop_thread();
  int32_t on_logits(int slot, std::span<float> logits, int32_t proposal = -1);
  void finish(int slot, FinishReason reason, const std::string& error = {});
  void abort_all();
  void fail_running(const std::string& error);
  void publish_metrics();

  // placement.cc
  void admit();
  enum class Placement { placed, wait, defer };
  Placement place(QueuedRequest& queued);
  void restore_in_background(Slot& slot, QueuedRequest&& queued, RestorePlan plan, int64_t reserve,
                             int64_t common, std::vector<PlannedSnapshot> snapshots);
  void finish_restores();
  void occupy(Slot& slot, int64_t reserve);
  void start(Slot& slot, QueuedRequest&& queued, int64_t reuse, int64_t common,
             std::vector<PlannedSnapshot> snapshots);

  // pass.cc
  void add_decode_tokens(std::vector<BatchToken>& batch, std::vector<PassPart>& parts);
  BatchToken token_at(int s, int64_t p, bool want_logits);
  void build_pass();
  void add_proposals(size_t n_decode);
  void run_pass();
  bool run_in_parts();
  void decode_between_parts();
  void take_results(std::span<const PassPart> parts);
  void check_proposals(const PassPart& part, size_t first_row);
  void keep_snapshots(int slot);
  void fail_parts(std::span<const PassPart> parts, const std::string& error);

  // images.cc
  void encode_images();
  bool encode_image(int slot, int image);

  Model& model_;
  const Tokenizer& tokenizer_;
  const EngineOptions options_;
  const int64_t sequence_length_, vocab_size_, chunk_size_;

  // Scheduler thread only.
  SlotSessions sessions_;      // the slots, their sessions, the KV budget and the session store
  std::vector<Slot>& slots_;   // sessions_.slots()
  SessionStore* const store_;  // sessions_.store(): null without the session cache
  std::vector<std::unique_ptr<ActiveRequest>> active_;  // [slot], null when idle
  std::vector<Sampler> samplers_;                       // [slot]
  EngineMetrics local_metrics_;
  RequestOutput output_;  // counts in local_metrics_
  ImageRowCache image_rows_;
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
  Clock::time_point last_tokens_at_;      // when a pass last gave slots their next tokens
  bool pass_has_prefill_ = false;
  // Speculative decoding: per slot its proposals for this pass; the draft proposers; scratch.
  std::vector<std::vector<int32_t>> proposals_;  // [slot][num_speculative_tokens]
  std::unique_ptr<DraftProposer> draft_proposer_;
  std::vector<DraftJob> draft_jobs_;
  std::vector<int> depth_, granted_;
  std::vector<double> rate_;
  std::vector<BatchToken> spec_batch_;
  std::vector<float> logits_;  // [batch_size][vocab]
  // Hybrid models: the snapshots the pass being run takes (slot, snapshot).
  std::vector<std::pair<int, StateSnapshot>> pass_snapshots_;
  // Requests whose prefix the restorer (below) is copying from the store into their slots.
  struct PendingRestore {
    QueuedRequest queued;
    int slot = -1;
    int64_t reserve = 0, common = 0;
    std::vector<PlannedSnapshot> snapshots;
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
