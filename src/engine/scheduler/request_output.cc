#include "engine/scheduler/request_output.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "base/error.h"
#include "text/tokenizer/tokenizer.h"

namespace ellm {
namespace {

void observe(EngineMetrics::Histogram& h, double seconds) {
  for (size_t i = 0; i < h.bounds.size(); ++i)
    if (seconds <= h.bounds[i]) ++h.counts[i];
  ++h.counts.back();
  h.sum += seconds;
  ++h.count;
}

bool contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// The text a generated id completes. A model's vocabulary may be padded beyond the
// tokenizer's (Qwen3: 151,936 rows, 151,669 tokens); an id without a token decodes to nothing.
std::string decode_next(IncrementalDetokenizer& detokenizer, const Tokenizer& tokenizer, int32_t id) {
  if (id < 0 || id >= tokenizer.vocab_size()) return {};
  try {
    return detokenizer.push(id);
  } catch (const Error&) {  // a hole in the tokenizer's ids
    return {};
  }
}

}  // namespace

StreamEvent end_event(FinishReason reason, const std::string& error) {
  StreamEvent event;
  event.finished = true;
  event.finish_reason = reason;
  event.error = error;
  return event;
}

RequestOutput::RequestOutput(const Tokenizer& tokenizer, const EngineOptions& options, EngineMetrics& metrics)
    : tokenizer_(tokenizer), options_(options), metrics_(metrics) {}

RequestOutput::Next RequestOutput::on_logits(ActiveRequest& request, Sampler& sampler, std::span<float> logits,
                                             int32_t proposal) {
  const auto now = Clock::now();
  if (request.generated == 0)
    observe(metrics_.time_to_first_token, seconds_between(request.submitted, now));
  else
    observe(metrics_.inter_token_latency, seconds_between(request.last_token, now));
  request.last_token = now;

  // The scripted test hook replaces sampling; past its end the request stops as at eos.
  const std::vector<int32_t>* script = request.script;
  if (script && request.generated >= int64_t(script->size())) return {-1, end_at_stop_token(request)};
  // A constraint masks the logits in place; when nothing may follow, the output ends.
  TokenConstraint* constraint = script ? nullptr : request.constraint.get();
  if (constraint && !constraint->mask(logits, request.max_new - request.generated))
    return {-1, constraint->complete() ? end_at_stop_token(request) : FinishReason::length};
  // Rows past the tokenizer's last id pad the embedding (Qwen3: 151,936 rows, 151,669 ids): never sampled.
  std::fill(logits.begin() + std::min<int64_t>(tokenizer_.vocab_size(), int64_t(logits.size())),
            logits.end(), -INFINITY);
  if (script && options_.scripted_token_seconds > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(options_.scripted_token_seconds));
  int32_t token = script ? (*script)[request.generated] : sampler.sample(logits, proposal);
  if (constraint) constraint->accept(token);
  StreamEvent event;
  if (request.request.sampling.top_logprobs >= 0) {
    event.logprobs.emplace_back();
    sampler.logprobs(logits, token, event.logprobs.back());
  }
  sampler.accept(token);
  ++request.generated;
  ++metrics_.generation_tokens_total;

  // Stop tokens end the request without appearing in its text or ids.
  bool is_eos = !request.request.ignore_eos && contains(options_.eos_token_ids, token);
  if (is_eos || contains(request.request.stop_token_ids, token)) return {token, end_at_stop_token(request)};

  request.sequence.push_back(token);
  event.ids.push_back(token);
  event.text = request.stop.push(decode_next(request.detokenizer, tokenizer_, token));
  bool at_limit = request.generated >= request.max_new;
  bool complete = constraint && constraint->finished();  // nothing may follow: no eos needed
  if ((at_limit || complete) && !request.stop.stopped())
    event.text += request.stop.push(request.detokenizer.flush()) + request.stop.flush();
  request.stream->push(std::move(event));
  if (request.stop.stopped() || complete) return {token, FinishReason::stop};
  if (at_limit) return {token, FinishReason::length};
  return {token, std::nullopt};
}

// Ends at a stop token: the text held back (an unfinished character, a stop-string prefix that
// never completed) is emitted first.
FinishReason RequestOutput::end_at_stop_token(ActiveRequest& request) {
  StreamEvent event;
  event.text = request.stop.push(request.detokenizer.flush()) + request.stop.flush();
  if (!event.text.empty()) request.stream->push(std::move(event));
  return FinishReason::stop;
}

StreamEvent RequestOutput::end(const ActiveRequest& request, FinishReason reason, const std::string& error) {
  StreamEvent event = end_event(reason, error);
  event.prompt_tokens = request.prompt_len;
  event.completion_tokens = request.generated;
  event.cached_tokens = request.cached;
  if (request.stop.stopped()) event.stop_sequence = request.stop.matched();
  observe(metrics_.e2e_latency, seconds_between(request.submitted, Clock::now()));
  ++metrics_.requests_finished_total;
  return event;
}

}  // namespace ellm
