// A scheduler step's pass: a decode token for every generating slot and the prefill that fits,
// with speculative proposals after the decode tokens (checked when the logits come back), run
// in one Model::forward or, when the prefill would stall the generating slots too long, in
// parts with their decode steps in between. The logits rows go to the requests' output
// (request_output.h) through Scheduler::on_logits.
#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <span>
#include <string>

#include "engine/prompt_lookup.h"
#include "engine/speculative_depth.h"
#include "model/config.h"

namespace ellm {

// A decode token for every generating slot.
void Scheduler::add_decode_tokens(std::vector<BatchToken>& batch, std::vector<PassPart>& parts) {
  for (int s = 0; s < int(active_.size()); ++s) {
    const ActiveRequest* request = active_[s].get();
    if (!request || int64_t(slots_[s].tokens.size()) < request->prompt_len) continue;
    int32_t position = int32_t(slots_[s].tokens.size());
    batch.push_back(token_at(s, position, true));
    parts.push_back({s, 1, true});
  }
}

// The model's token for position p of slot s's sequence: an image's pad carries the tower's row
// (encode_images gave it before the pass), and every token after an image its rope position.
BatchToken Scheduler::token_at(int s, int64_t p, bool want_logits) {
  const ActiveRequest& request = *active_[s];
  return request.images.token(model_, request.sequence[size_t(p)], s, p, want_logits);
}

// One pass: a decode token for every generating slot, then prefill up to the chunk size.
void Scheduler::build_pass() {
  batch_.clear();
  parts_.clear();
  pass_snapshots_.clear();
  add_decode_tokens(batch_, parts_);
  const size_t n_decode = batch_.size();
  int64_t room = std::min(chunk_size_, model_.max_pass_tokens() - int64_t(batch_.size()));
  // Oldest admission first, so a long prompt in chunks is not overtaken forever.
  while (room > 0) {
    int next = -1;
    for (int s = 0; s < int(active_.size()); ++s) {
      bool prefilling = active_[s] && int64_t(slots_[s].tokens.size()) < active_[s]->prompt_len;
      bool planned = std::any_of(parts_.begin(), parts_.end(), [&](auto& p) { return p.slot == s; });
      if (prefilling && !planned && (next < 0 || slots_[s].last_used < slots_[next].last_used))
        next = s;
    }
    if (next < 0) break;
    const ActiveRequest& request = *active_[next];
    int64_t begin = int64_t(slots_[next].tokens.size());
    int64_t count = std::min(request.prompt_len - begin, room);
    bool logits = begin + count == request.prompt_len;
    auto planned = request.snapshots.begin();
    for (int64_t p = begin; p < begin + count; ++p) {
      batch_.push_back(token_at(next, p, logits && p + 1 == begin + count));
      while (planned != request.snapshots.end() && planned->position < p + 1) ++planned;
      if (planned != request.snapshots.end() && planned->position == p + 1) {
        StateSnapshot snapshot{p + 1, new_state_buffer(sessions_.state_bytes()), planned->shared};
        batch_.back().snapshot = snapshot.state.get();
        pass_snapshots_.emplace_back(next, std::move(snapshot));
      }
    }
    parts_.push_back({next, count, logits});
    room -= count;
  }
  // A prefill that would stop the generating slots too long runs in parts, and their decode
  // steps run between the parts instead of in this pass.
  const double stall = options_.max_decode_stall_seconds;
  const int64_t n_prefill = int64_t(batch_.size() - n_decode);
  in_parts_ = n_decode > 0 && stall > 0 && double(n_prefill) * prefill_seconds_per_token_ > stall / 2;
  pass_has_prefill_ = n_prefill > 0;
  if (in_parts_) {
    batch_.erase(batch_.begin(), batch_.begin() + ptrdiff_t(n_decode));
    parts_.erase(parts_.begin(), parts_.begin() + ptrdiff_t(n_decode));
  } else if (draft_proposer_) {
    add_proposals(n_decode);
  }
}

// Speculative decoding: proposals for the decoding slots (parts_[0, n_decode)), each slot's next
// token and its proposals one group, all with logits. How many each stream proposes follows how
// many it got kept; together they stay within speculative_pass_rows and the pass's room.
void Scheduler::add_proposals(size_t n_decode) {
  int wanted = 0;
  for (size_t i = 0; i < n_decode; ++i) {
    const ActiveRequest& request = *active_[parts_[i].slot];
    // The group's tokens after the next one write KV that only kept tokens would need.
    const int64_t left = request.max_new - request.generated - 1;
    depth_[i] = request.proposer == Proposer::none ? 0 : int(std::min<int64_t>(request.depth.depth(), left));
    rate_[i] = request.depth.rate();
    wanted += depth_[i];
    if (depth_[i] == 0) active_[parts_[i].slot]->depth.step_without();
  }
  if (wanted == 0) return;
  const int64_t room = std::min(options_.speculative_pass_rows - int64_t(n_decode),
                                model_.max_pass_tokens() - int64_t(batch_.size()));
  share_budget(std::span(depth_).first(n_decode), std::span<const double>(rate_).first(n_decode),
               int(std::max<int64_t>(room, 0)), granted_);

  // The proposals: prompt lookup here, the models' by proposer, all slots of one at once.
  for (Proposer proposer : {Proposer::mtp, Proposer::draft}) {
    draft_jobs_.clear();
    for (size_t i = 0; i < n_decode; ++i) {
      const int s = parts_[i].slot;
      const ActiveRequest& request = *active_[s];
      if (request.proposer == proposer && depth_[i] > 0)
        draft_jobs_.push_back({s, request.sequence, depth_[i], proposals_[s].data()});
    }
    const auto start = Clock::now();
    draft_proposer_->propose(proposer, draft_jobs_);
    if (!draft_jobs_.empty())
      local_metrics_.speculative[int(proposer)].propose_seconds += seconds_between(start, Clock::now());
    for (const DraftJob& job : draft_jobs_)
      for (size_t i = 0; i < n_decode; ++i)
        if (parts_[i].slot == job.slot) parts_[i].proposed = job.made;
  }
  spec_batch_.clear();
  for (size_t i = 0; i < n_decode; ++i) {
    PassPart& part = parts_[i];
    ActiveRequest& request = *active_[part.slot];
    if (request.proposer == Proposer::ngram && depth_[i] > 0) {
      const auto start = Clock::now();
      part.proposed = propose_ngram(request.sequence, depth_[i], proposals_[part.slot].data());
      // A copy that reaches an image's pads ends before them: a pad is not a token to generate.
      for (int64_t j = 0; j < part.proposed; ++j)
        if (is_image_identity(proposals_[part.slot][j])) part.proposed = j;
      local_metrics_.speculative[int(Proposer::ngram)].propose_seconds += seconds_between(start, Clock::now());
    }
    BatchToken next = batch_[i];
    if (part.proposed == 0) {
      spec_batch_.push_back(next);
      continue;
    }
    next.speculative = true;
    spec_batch_.push_back(next);
    for (int64_t j = 0; j < part.proposed; ++j) {
      // Through the request's images for the rope position after them (text ids only here).
      BatchToken proposal = request.images.token(model_, proposals_[part.slot][j], next.slot, next.position + 1 + j, true);
      proposal.speculative = true;
      spec_batch_.push_back(proposal);
    }
    part.count = 1 + part.proposed;
  }
  spec_batch_.insert(spec_batch_.end(), batch_.begin() + ptrdiff_t(n_decode), batch_.end());
  batch_.swap(spec_batch_);
}

void Scheduler::run_pass() {
  const auto start = Clock::now();
  try {
    if (in_parts_) {
      if (!run_in_parts()) return;
    } else {
      model_.forward(batch_, logits_.data());
      const double seconds = seconds_between(start, Clock::now());
      if (!pass_has_prefill_) decode_step_seconds_ = seconds;
      if (batch_.size() >= 64) prefill_seconds_per_token_ = seconds / double(batch_.size());
    }
  } catch (const std::exception& e) {
    // The KV these tokens were writing cannot be trusted: drop those sessions.
    fail_parts(parts_, std::string("model forward failed: ") + e.what());
    return;
  }
  take_results(parts_);
}

// Runs batch_ in parts (a layer over some rows each); between two parts, when the generating
// slots would otherwise wait past the stall limit, one decode step for them. Returns false when
// the pass was dropped: every request in it was cancelled, or the scheduler is stopping.
bool Scheduler::run_in_parts() {
  const double stall = options_.max_decode_stall_seconds;
  const int64_t n = int64_t(batch_.size());
  // Parts of about a quarter of the stall limit: the first sized from the last pass's speed,
  // each next one from the part before (at most twice as many rows: attention grows with them).
  const double part_target = stall / 4;
  const int64_t layers = std::max<int64_t>(1, model_.config().num_hidden_layers);
  int64_t rows = std::clamp<int64_t>(int64_t(part_target * double(layers) / prefill_seconds_per_token_), 16, n);
  double prefill_seconds = 0;
  model_.begin_pass(batch_);
  for (;;) {
    const auto start = Clock::now();
    const bool done = model_.run_part(rows, logits_.data());
    const double part_seconds = seconds_between(start, Clock::now());
    prefill_seconds += part_seconds;
    if (done) break;
    const int64_t next_rows = std::clamp<int64_t>(
        int64_t(double(rows) * std::min(2.0, part_target / std::max(part_seconds, 1e-6))), 16, n);
    const double next_part_seconds = part_seconds * double(next_rows) / double(rows);
    rows = next_rows;
    bool all_cancelled = std::all_of(parts_.begin(), parts_.end(),
                                     [&](const PassPart& p) { return active_[p.slot]->stream->cancelled(); });
    bool stopping = false;
    {
      std::lock_guard lock(mutex_);
      stopping = stopping_;
    }
    if (all_cancelled || stopping) {  // a shutdown need not wait for the rest of a long prefill
      model_.cancel_pass();
      for (const PassPart& part : parts_) {
        sessions_.forget(slots_[part.slot]);
        finish(part.slot, FinishReason::abort);
      }
      return false;
    }
    if (seconds_between(last_tokens_at_, Clock::now()) + next_part_seconds + decode_step_seconds_ >= stall)
      decode_between_parts();
  }
  prefill_seconds_per_token_ = prefill_seconds / double(n);
  return true;
}

// One decode step for the generating slots while a pass is open (its slots are prefilling, so
// none of them is in it).
void Scheduler::decode_between_parts() {
  for (int s = 0; s < int(active_.size()); ++s)
    if (active_[s] && active_[s]->stream->cancelled() &&
        int64_t(slots_[s].tokens.size()) >= active_[s]->prompt_len)
      finish(s, FinishReason::abort);
  step_batch_.clear();
  step_parts_.clear();
  add_decode_tokens(step_batch_, step_parts_);
  if (step_batch_.empty()) return;
  const auto start = Clock::now();
  try {
    model_.forward(step_batch_, logits_.data());
  } catch (const std::exception& e) {
    fail_parts(step_parts_, std::string("model forward failed: ") + e.what());
    return;
  }
  decode_step_seconds_ = seconds_between(start, Clock::now());
  take_results(step_parts_);
}

void Scheduler::fail_parts(std::span<const PassPart> parts, const std::string& error) {
  for (const PassPart& part : parts) {
    try {
      sessions_.forget(slots_[part.slot]);
      if (draft_proposer_) draft_proposer_->forget(part.slot);
    } catch (const std::exception&) {  // the session is forgotten; its pages stay counted
    }
    if (active_[part.slot]) finish(part.slot, FinishReason::error, error);
  }
}

// After a pass: the slots hold the tokens fed, and the logits rows go to their requests.
void Scheduler::take_results(std::span<const PassPart> parts) {
  if (std::any_of(parts.begin(), parts.end(), [](const PassPart& p) { return p.logits || p.proposed > 0; }))
    last_tokens_at_ = Clock::now();
  size_t row = 0;
  for (const PassPart& part : parts) {
    if (part.proposed > 0) {
      check_proposals(part, row);
      row += size_t(part.count);
      continue;
    }
    Slot& slot = slots_[part.slot];
    const ActiveRequest& request = *active_[part.slot];
    size_t begin = slot.tokens.size();
    slot.tokens.insert(slot.tokens.end(), request.sequence.begin() + begin,
                       request.sequence.begin() + begin + part.count);
    slot.kv_high = std::max<int64_t>(slot.kv_high, int64_t(slot.tokens.size()));
    keep_snapshots(part.slot);
    if (!part.logits) continue;
    std::span<float> logits(logits_.data() + row * vocab_size_, vocab_size_);
    ++row;
    try {
      on_logits(part.slot, logits);
    } catch (const std::exception& e) {  // this request's problem only; the others go on
      if (active_[part.slot]) finish(part.slot, FinishReason::error, std::string("generation failed: ") + e.what());
    }
  }
}

// The snapshots the pass took of a slot's state join its session.
void Scheduler::keep_snapshots(int slot_index) {
  Slot& slot = slots_[slot_index];
  int64_t taken = 0;
  for (auto& [slot_of, snapshot] : pass_snapshots_)
    if (slot_of == slot_index && snapshot.state && snapshot.position <= int64_t(slot.tokens.size())) {
      add_snapshot(slot.snapshots, std::move(snapshot));
      ++taken;
    }
  if (taken == 0) return;
  std::erase_if(active_[slot_index]->snapshots,
                [&](const PlannedSnapshot& p) { return p.position <= int64_t(slot.tokens.size()); });
  const size_t before = slot.snapshots.size();
  thin_snapshots(slot.snapshots, options_.state_snapshot_interval);
  store_->count_hot_snapshots(taken, 0, int64_t(before - slot.snapshots.size()));
}

// A slot's group of speculative tokens: its next token and part.proposed proposals, a row of
// logits each. Row i chooses the token after token i, exactly as a decode step would (on_logits
// with the proposal: greedy takes the argmax, sampling the rejection rule); proposal i + 1 is
// kept while it is that choice. The slot keeps the tokens up to the last kept one; the model
// and the draft model drop the rest.
void Scheduler::check_proposals(const PassPart& part, size_t first_row) {
  const int s = part.slot;
  Slot& slot = slots_[s];
  const Proposer proposer = active_[s]->proposer;
  const std::vector<int32_t>& proposed = proposals_[s];
  const int64_t begin = int64_t(slot.tokens.size());
  slot.tokens.push_back(active_[s]->sequence[size_t(begin)]);
  // Counted as it goes: a request that ends here publishes the metrics.
  EngineMetrics::Speculative& counts = local_metrics_.speculative[int(proposer)];
  ++counts.checks;
  counts.proposed += part.proposed;
  int64_t kept = 0;
  for (int64_t i = 0; i <= part.proposed; ++i) {
    std::span<float> logits(logits_.data() + (first_row + size_t(i)) * vocab_size_, vocab_size_);
    const int32_t proposal = i < part.proposed ? proposed[size_t(i)] : -1;
    int32_t chosen = -1;
    try {
      chosen = on_logits(s, logits, proposal);
    } catch (const std::exception& e) {  // this request's problem only; the others go on
      if (active_[s]) finish(s, FinishReason::error, std::string("generation failed: ") + e.what());
    }
    if (!active_[s] || proposal < 0 || chosen != proposal) break;  // a request that ended keeps no more
    slot.tokens.push_back(proposal);
    ++kept;
    ++counts.accepted;
  }
  slot.kv_high = std::max<int64_t>(slot.kv_high, begin + 1 + part.proposed);
  model_.accept(s, begin + 1 + kept);
  draft_proposer_->accepted(s, begin + 1 + kept);
  if (active_[s]) active_[s]->depth.record(int(part.proposed), int(kept));
}

}  // namespace ellm
