#pragma once
// Speculative decoding (engine/proposer.h): how many tokens each stream proposes per pass, and
// how a pass's rows are shared among the streams.
#include <span>

namespace ellm {

// How many tokens one stream proposes, from how often its proposals were kept: proposal i of a
// pass is worth its chance of being reached and kept, rate^i, so the depth is the largest k
// with rate^k >= kWorth. A stream whose rate falls below kWorth stops proposing for a while
// (its passes are plain decode steps), then tries one token again, waiting twice as long each
// time it still fails.
class SpeculativeDepth {
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
