#include "engine/speculation.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace ellm {

const char* proposer_name(Proposer proposer) {
  switch (proposer) {
    case Proposer::ngram: return "ngram";
    case Proposer::mtp: return "mtp";
    case Proposer::draft: return "draft";
    default: return "none";
  }
}

Proposer parse_proposer(const std::string& name, const std::string& where) {
  if (name == "none") return Proposer::none;
  if (name == "ngram") return Proposer::ngram;
  if (name == "mtp") return Proposer::mtp;
  if (name == "draft" || name.rfind("draft:", 0) == 0) return Proposer::draft;
  fail(where, "unknown speculative method '" + name + "' (expected ngram, mtp, draft:PATH or none)");
}

int propose_ngram(std::span<const int32_t> sequence, int k, int32_t* out) {
  const int64_t n = int64_t(sequence.size());
  if (k <= 0 || n < kMinNgram + 1) return 0;
  const int32_t* s = sequence.data();
  // For each earlier end e (the n-gram s[e - len, e) followed by s[e]), the length of the
  // match with the sequence's end; the longest wins, the latest among equals.
  int64_t best_end = -1, best_len = 0;
  for (int64_t e = n - 1; e >= kMinNgram; --e) {
    int64_t len = 0;
    while (len < kMaxNgram && len < e && s[e - 1 - len] == s[n - 1 - len]) ++len;
    if (len > best_len) {
      best_len = len;
      best_end = e;
      if (len == kMaxNgram) break;
    }
  }
  if (best_len < kMinNgram) return 0;
  // What followed the match; where that runs into the end, the sequence repeats itself with
  // period n - best_end (a loop, or a match overlapping the end), and so the proposal.
  for (int j = 0; j < k; ++j) out[j] = s[best_end + j % (n - best_end)];
  return k;
}

void SpeculationControl::start(int max_depth) {
  *this = SpeculationControl();
  max_depth_ = max_depth;
}

int SpeculationControl::depth() const {
  if (paused_ > 0 || max_depth_ == 0) return 0;
  const double r = rate();
  if (r >= 0.999) return max_depth_;
  const int k = int(std::floor(std::log(kWorth) / std::log(r)));
  return std::clamp(k, 1, max_depth_);
}

void SpeculationControl::record(int proposed, int kept) {
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

void SpeculationControl::step_without() {
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
