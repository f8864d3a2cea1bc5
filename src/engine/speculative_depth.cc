#include "engine/speculative_depth.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace ellm {

void SpeculativeDepth::start(int max_depth) {
  *this = SpeculativeDepth();
  max_depth_ = max_depth;
}

int SpeculativeDepth::depth() const {
  if (paused_ > 0 || max_depth_ == 0) return 0;
  const double r = rate();
  if (r >= 0.999) return max_depth_;
  const int k = int(std::floor(std::log(kWorth) / std::log(r)));
  return std::clamp(k, 1, max_depth_);
}

void SpeculativeDepth::record(int proposed, int kept) {
  if (proposed <= 0) return;
  // The positions where a proposal was checked: each kept one, and the first one refused.
  constexpr double kDecay = 0.7;
  kept_ = kDecay * kept_ + kept;
  tried_ = kDecay * tried_ + kept + (kept < proposed ? 1 : 0);
  if (rate() >= 0.5) pause_length_ = 8;
  if (rate() < kWorth) {
    paused_ = pause_length_;
    pause_length_ = std::min(2 * pause_length_, 256);
    kept_ = 0.3, tried_ = 1.0;  // after the pause: one token, and a rate that must hold up
  }
}

void SpeculativeDepth::step_without() {
  if (paused_ > 0) --paused_;
}

void share_budget(std::span<int> depth, std::span<const double> rate, int budget,
                  std::span<int> granted) {
  std::fill(granted.begin(), granted.end(), 0);
  for (; budget > 0; --budget) {
    int64_t best = -1;
    double best_worth = 0;
    for (size_t i = 0; i < depth.size(); ++i) {
      if (granted[i] >= depth[i]) continue;
      const double worth = std::pow(rate[i], granted[i] + 1);
      if (best < 0 || worth > best_worth) best = int64_t(i), best_worth = worth;
    }
    if (best < 0) break;
    ++granted[best];
  }
  std::copy(granted.begin(), granted.begin() + ptrdiff_t(depth.size()), depth.begin());
}

}  // namespace ellm
