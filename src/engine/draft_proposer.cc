#include "engine/draft_proposer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "base/log.h"
#include "engine/slots.h"

namespace ellm {

DraftProposer::DraftProposer(Model& target, std::unique_ptr<Model> draft, int64_t vocab_limit)
    : target_(target), draft_(std::move(draft)), vocab_limit_(std::min(vocab_limit, target.vocab_size())) {
  const int64_t slots = target.limits().batch_size;
  if (draft_) {
    if (draft_->vocab_size() != target.vocab_size())
      fail("--speculative draft", "the draft model has " + std::to_string(draft_->vocab_size()) +
                                      " token ids, the model " + std::to_string(target.vocab_size()) +
                                      ": a draft model needs the same tokenizer");
    if (draft_->limits().batch_size < slots || draft_->limits().sequence_length < target.limits().sequence_length)
      fail("--speculative draft", "the draft model needs as many slots and positions as the model");
    held_.resize(size_t(slots));
    for (auto& held : held_) held.reserve(size_t(target.limits().sequence_length));
    chain_.resize(size_t(slots));
    for (auto& chain : chain_) chain.reserve(size_t(target.limits().speculative_tokens));
    group_begin_.assign(size_t(slots), 0);
    batch_.reserve(size_t(draft_->max_pass_tokens()));
  }
  batch_.reserve(size_t(slots));
  active_.reserve(size_t(slots));
  logits_.resize(size_t(slots * target.vocab_size()));
}

int32_t DraftProposer::best(const float* row) const {
  return int32_t(std::max_element(row, row + vocab_limit_) - row);
}

void DraftProposer::propose(Proposer proposer, std::span<DraftJob> jobs) {
  for (DraftJob& job : jobs) job.made = 0;
  if (jobs.empty()) return;
  if (proposer == Proposer::mtp) return propose_mtp(jobs);
  if (proposer == Proposer::draft && draft_) return propose_draft(jobs);
}

// One mtp_forward per depth: the slot's next token first, then each draft after the last.
void DraftProposer::propose_mtp(std::span<DraftJob> jobs) {
  const int64_t V = target_.vocab_size();
  for (int d = 0;; ++d) {
    batch_.clear();
    active_.clear();
    for (DraftJob& job : jobs) {
      if (job.made != d || d >= job.depth) continue;
      const int64_t next = int64_t(job.sequence.size()) - 1;  // its position
      batch_.push_back({d == 0 ? job.sequence.back() : job.out[d - 1], job.slot, int32_t(next + d), true});
      active_.push_back(&job);
    }
    if (batch_.empty()) return;
    try {
      target_.mtp_forward(batch_, logits_.data());
    } catch (const Error& e) {  // a slot without a hidden state to draft from: no more drafts
      log_warn(std::string("speculative mtp: ") + e.what());
      return;
    }
    for (size_t i = 0; i < active_.size(); ++i) active_[i]->out[active_[i]->made++] = best(logits_.data() + i * V);
  }
}

// Matches each job's slot of the draft model to its sequence (what it holds beyond their common
// prefix is dropped; a recurrent state starts over), then feeds the slots what they miss, but
// for the tokens the first draft pass can take beside their next tokens. Returns how many that
// pass still has to feed.
int64_t DraftProposer::catch_up(std::span<DraftJob> jobs) {
  const bool recurrent = draft_->has_recurrent_state();
  int64_t behind = 0;
  for (DraftJob& job : jobs) {
    std::vector<int32_t>& held = held_[job.slot];
    const auto known = job.sequence.first(job.sequence.size() - 1);
    int64_t common = int64_t(common_prefix(held, known));
    if (common < int64_t(held.size()) && recurrent) common = 0;  // its state cannot go back
    held.resize(size_t(common));
    behind += int64_t(known.size()) - common;
  }
  const int64_t room = draft_->max_pass_tokens();
  while (behind + int64_t(jobs.size()) > room) {
    batch_.clear();
    for (DraftJob& job : jobs) {
      std::vector<int32_t>& held = held_[job.slot];
      const int64_t missing = int64_t(job.sequence.size()) - 1 - int64_t(held.size());
      const int64_t take = std::min<int64_t>(missing, room - int64_t(batch_.size()));
      for (int64_t i = 0; i < take; ++i) {
        batch_.push_back({job.sequence[held.size()], job.slot, int32_t(held.size()), false});
        held.push_back(job.sequence[held.size()]);
      }
    }
    draft_->forward(batch_, nullptr);
    behind -= int64_t(batch_.size());
  }
  return behind;
}

// The draft model: what its slots miss and their next tokens (one pass), then one pass per
// further draft, each draft fed as a speculative token of its slot.
void DraftProposer::propose_draft(std::span<DraftJob> jobs) {
  const int64_t V = draft_->vocab_size();
  try {
    catch_up(jobs);
    for (int d = 0;; ++d) {
      batch_.clear();
      active_.clear();
      for (DraftJob& job : jobs) {
        if (job.made != d || d >= job.depth) continue;
        const int64_t next = int64_t(job.sequence.size()) - 1;
        std::vector<int32_t>& held = held_[job.slot];
        if (d == 0) {
          while (int64_t(held.size()) <= next) {
            const int64_t p = int64_t(held.size());
            batch_.push_back({job.sequence[p], job.slot, int32_t(p), p == next});
            held.push_back(job.sequence[p]);
          }
          group_begin_[job.slot] = next + 1;
          chain_[job.slot].clear();
        } else {
          batch_.push_back({job.out[d - 1], job.slot, int32_t(next + d), true, true});
          chain_[job.slot].push_back(job.out[d - 1]);
        }
        active_.push_back(&job);
      }
      if (batch_.empty()) return;
      draft_->forward(batch_, logits_.data());
      for (size_t i = 0; i < active_.size(); ++i) active_[i]->out[active_[i]->made++] = best(logits_.data() + i * V);
    }
  } catch (const Error& e) {  // the draft model's slots are garbage now
    log_warn(std::string("speculative draft model: ") + e.what());
    for (DraftJob& job : jobs) {
      job.made = 0;
      forget(job.slot);
    }
  }
}

void DraftProposer::accepted(int slot, int64_t end) {
  if (!draft_ || chain_[slot].empty()) return;
  // The draft model fed drafts [group_begin, group_begin + chain size) speculatively.
  const int64_t begin = group_begin_[slot];
  const int64_t keep = std::clamp<int64_t>(end, begin, begin + int64_t(chain_[slot].size()));
  draft_->accept(slot, keep);
  held_[slot].insert(held_[slot].end(), chain_[slot].begin(), chain_[slot].begin() + (keep - begin));
  chain_[slot].clear();
}

void DraftProposer::forget(int slot) {
  if (!draft_) return;
  held_[slot].clear();
  chain_[slot].clear();
  draft_->release_kv(slot, 0);
}

}  // namespace ellm
