#pragma once
// The proposers that run a model: the target's own MTP head (Model::mtp_forward) and a draft
// model (a small model of the same tokenizer, its own slots and KV, the target's thread team).
// Both draft greedily, one pass per depth for all slots at once; the draft model first feeds
// its slots what they have not seen of their sequences (the accepted tokens, the prompt of a
// new request), and keeps only what the target accepted (Model::accept).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/proposer.h"
#include "model/model.h"

namespace ellm {

struct DraftJob {
  int slot;
  std::span<const int32_t> sequence;  // prompt + generated; the target holds all but the last
  int depth;                          // tokens wanted
  int32_t* out;                       // [depth]: the proposals
  int made = 0;                       // out: how many were made
};

class DraftProposer {
 public:
  // `vocab_limit`: ids at or above it (padding rows of the embedding) are never proposed.
  DraftProposer(Model& target, std::unique_ptr<Model> draft, int64_t vocab_limit);
  Model* draft_model() { return draft_.get(); }

  // Fills every job's proposals, with `proposer` (mtp or draft) for all of them.
  void propose(Proposer proposer, std::span<DraftJob> jobs);
  // After the target checked a slot's tokens: it holds positions below `end`.
  void accepted(int slot, int64_t end);
  // The slot's sequence is gone (its pass failed): the draft model starts it over.
  void forget(int slot);

 private:
  void propose_mtp(std::span<DraftJob> jobs);
  void propose_draft(std::span<DraftJob> jobs);
  int64_t catch_up(std::span<DraftJob> jobs);
  int32_t best(const float* row) const;

  Model& target_;
  std::unique_ptr<Model> draft_;
  int64_t vocab_limit_;
  // Per slot of the draft model: the tokens it holds (accepted ones), and the drafts it fed
  // speculatively from position group_begin_ on, until the target's check.
  std::vector<std::vector<int32_t>> held_, chain_;
  std::vector<int64_t> group_begin_;
  std::vector<BatchToken> batch_;
  std::vector<DraftJob*> active_;  // the jobs of the rows of a pass
  std::vector<float> logits_;  // [batch][vocab]
};

}  // namespace ellm
