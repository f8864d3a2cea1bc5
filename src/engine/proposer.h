#pragma once
// Speculative decoding, the engine's side: where proposed tokens come from. A decoding slot's
// pass carries its next token plus k proposed ones; their k + 1 rows of logits come back from
// one pass (reading the weights once, about a decode step's cost at small batches), and the
// scheduler keeps the proposals while they are what it would have chosen (sampling.h: greedy
// exactly, sampling by the rejection rule). How many each stream proposes: speculative_depth.h.
//
// Proposers:
//   ngram  prompt lookup (prompt_lookup.h): the longest recent n-gram of the sequence found
//          earlier in it (prompt or output) proposes what followed it there. No model: every
//          architecture.
//   mtp    the model's own multi-token-prediction head (Qwen3.5+; Model::mtp_forward;
//          draft_proposer.h).
//   draft  a small model of the same tokenizer, with its own slots, on the same thread team
//          (draft_proposer.h).
#include <string>

namespace ellm {

enum class Proposer { none = 0, ngram, mtp, draft, count };
const char* proposer_name(Proposer proposer);
// "none", "ngram", "mtp", "draft" (also "draft:PATH": the path is the caller's); throws Error
// naming `where` otherwise.
Proposer parse_proposer(const std::string& name, const std::string& where);

}  // namespace ellm
