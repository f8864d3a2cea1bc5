#pragma once
// Speculative decoding, the engine's side: where proposed tokens come from and how many each
// stream proposes. A decoding slot's pass carries its next token plus k proposed ones; their k
// + 1 rows of logits come back from one pass (reading the weights once, about a decode step's
// cost at small batches), and the scheduler keeps the proposals while they are what it would
// have chosen (sampling.h: greedy exactly, sampling by the rejection rule).
//
// Proposers:
//   ngram  prompt lookup: the longest recent n-gram of the sequence found earlier in it
//          (prompt or output) proposes what followed it there. No model: every architecture.
//   mtp    the model's own multi-token-prediction head (Qwen3.5+; Model::mtp_forward).
//   draft  a small model of the same tokenizer, with its own slots, on the same thread team.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ellm {

class Model;

enum class Proposer { none = 0, ngram, mtp, draft, count };
const char* proposer_name(Proposer proposer);
// "none", "ngram", "mtp", "draft" (also "draft:PATH": the path is the caller's); throws Error
// naming `where` otherwise.
Proposer parse_proposer(const std::string& name, const std::string& where);

// Prompt lookup: the most recent earlier occurrence of the longest n-gram (kMinNgram ..
// kMaxNgram tokens) that ends `sequence`; the k tokens that followed it go to out (where they
// run into the end, the sequence is taken to repeat with that period). Returns k, or 0 when
// nothing matches.
constexpr int kMinNgram = 2, kMaxNgram = 8;
int propose_ngram(std::span<const int32_t> sequence, int k, int32_t* out);

// How many tokens one stream proposes, from how often its proposals were kept: proposal i of a
// pass is worth its chance of being reached and kept, rate^i, so the depth is the largest k
// with rate^k >= kWorth. A stream whose rate falls below kWorth stops proposing for a while
// (its passes are plain decode steps), then tries one token again, waiting twice as long each
// time it still fails.
class SpeculationControl {
 public:
  static constexpr double kWorth = 0.25;

  void start(int max_depth);
  int depth() const;  // tokens to propose now; 0 while paused
  double rate() const { return kept_ / tried_; }
  // After a check: `proposed` tokens, the first `kept` of them kept.
  void record(int proposed, int kept);
  void step_without();  // a pass without proposals (counts the pause down)

 private:
  int max_depth_ = 0;
  double kept_ = 0.6, tried_ = 1.0;  // a prior of a 60% rate, worth about one pass
  int paused_ = 0, pause_length_ = 8;
};

// Shares `budget` proposed tokens among streams that want depth[i] each: proposal j of stream
// i is worth rate[i]^j, and the most valuable go first. Lowers depth[i] in place; `granted` is
// scratch of the same size.
void share_budget(std::span<int> depth, std::span<const double> rate, int budget,
                  std::span<int> granted);

}  // namespace ellm
