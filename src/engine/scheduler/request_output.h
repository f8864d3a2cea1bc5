#pragma once
// A request's way out, after a pass: its row of logits → its output constraint's mask → the
// sampler → stop tokens and stop strings → the incremental detokenizer → its stream. It knows
// nothing of slots and passes: it says when the request ends, having pushed the request's last
// text, and the scheduler frees the slot and pushes the end event (Scheduler::finish).
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "engine/engine.h"
#include "engine/request.h"
#include "engine/sampling.h"
#include "engine/scheduler/requests.h"

namespace ellm {

class Tokenizer;

// An end event: no text or ids, the reason (and the error message), no counts.
StreamEvent end_event(FinishReason reason, const std::string& error = {});

class RequestOutput {
 public:
  // Counts the generated tokens, the finished requests and the latency histograms in `metrics`
  // (the scheduler's; all three references must outlive this).
  RequestOutput(const Tokenizer& tokenizer, const EngineOptions& options, EngineMetrics& metrics);

  // What a row of logits did to its request: the token it chose (-1: none, the request ended
  // before), and the reason when the request ends with it (the caller finishes it then).
  struct Next {
    int32_t token = -1;
    std::optional<FinishReason> end;
  };
  // Samples the request's next token (keeping `proposal` when it passes, speculative decoding)
  // and streams what it completes.
  Next on_logits(ActiveRequest& request, Sampler& sampler, std::span<float> logits, int32_t proposal = -1);
  // The request's end event, with its counts; counts the request as finished.
  StreamEvent end(const ActiveRequest& request, FinishReason reason, const std::string& error);

 private:
  FinishReason end_at_stop_token(ActiveRequest& request);

  const Tokenizer& tokenizer_;
  const EngineOptions& options_;
  EngineMetrics& metrics_;
};

}  // namespace ellm
