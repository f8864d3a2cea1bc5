#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ellm {
namespace {

// Uniform double in [0, 1) from the top 53 bits: the same sequence on every standard library.
double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

bool is_positive(float x) { return x > 0.0f && std::isfinite(x); }

// NaN sorts last so it is never preferred over a number.
float orderable(float x) { return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x; }

// Strict order "more likely first", ties by lower id, so selections are deterministic.
struct MoreLikely {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    float la = orderable(logits[a]), lb = orderable(logits[b]);
    return la > lb || (la == lb && a < b);
  }
};

}  // namespace

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  float best_value = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > best_value) {
      best_value = logits[i];
      best = int32_t(i);
    }
  }
  return best;
}

void apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> context_ids,
                              float penalty) {
  if (!is_positive(penalty) || penalty == 1.0f) return;
  for (int32_t id : context_ids) {
    float& l = logits[id];
    l = l > 0 ? l / penalty : l * penalty;
  }
}

void apply_presence_frequency(std::span<float> logits, std::span<const int32_t> generated_ids,
                              std::span<const int32_t> counts, float presence, float frequency) {
  if (!std::isfinite(presence)) presence = 0;
  if (!std::isfinite(frequency)) frequency = 0;
  if (presence == 0 && frequency == 0) return;
  for (int32_t id : generated_ids) {
    int32_t count = counts[id];
    if (count > 0) logits[id] -= float(count) * frequency + presence;
  }
}

namespace {

// Reorders ids[0, n) so that the shortest most-likely-first prefix holding `target` of the
// weight comes first, and returns its length. A quickselect on mass: expected O(n), no sort of
// the whole vocabulary.
int64_t select_top_mass(int32_t* ids, int64_t n, const float* logits, const float* weights,
                        double target) {
  MoreLikely more_likely{logits};
  int64_t lo = 0, hi = n;  // ids[0, lo) are in; the cut lies in (lo, hi]
  double mass_in = 0;
  while (hi - lo > 32) {
    int32_t pivot = ids[lo + (hi - lo) / 2];
    int32_t* mid = std::partition(ids + lo, ids + hi, [&](int32_t id) { return more_likely(id, pivot); });
    int64_t m = mid - ids;  // ids[lo, m) beat the pivot
    std::iter_swap(mid, std::find(mid, ids + hi, pivot));
    double upper = 0;
    for (int64_t i = lo; i <= m; ++i) upper += weights[ids[i]];
    if (mass_in + upper >= target) {
      hi = m + 1;
    } else {
      mass_in += upper;
      lo = m + 1;
    }
  }
  std::sort(ids + lo, ids + hi, more_likely);
  for (int64_t i = lo; i < hi; ++i) {
    mass_in += weights[ids[i]];
    if (mass_in >= target) return i + 1;
  }
  return hi;
}

}  // namespace

namespace {

// The candidates sample_filtered draws from: ids[0, n) (returns n) with unnormalised weights
// (weights[id]; the best id weighs exactly 1), after top-k, top-p and min-p. The best logit
// is finite.
int64_t candidates(std::span<const float> logits, float temperature, int top_k, float top_p,
                   float min_p, int32_t* ids, float* weights) {
  const int64_t vocab = int64_t(logits.size());
  const float* l = logits.data();
  const int32_t best = argmax(logits);
  const float max_logit = l[best];
  const float inv_t = 1.0f / temperature;
  for (int64_t i = 0; i < vocab; ++i) {
    float w = std::exp((l[i] - max_logit) * inv_t);
    weights[i] = std::isnan(w) ? 0.0f : w;
  }
  for (int64_t i = 0; i < vocab; ++i) ids[i] = int32_t(i);
  int64_t n = vocab;
  if (top_k > 0 && top_k < vocab) {
    n = top_k;
    std::nth_element(ids, ids + n, ids + vocab, MoreLikely{l});
  }
  if (top_p > 0.0f && top_p < 1.0f) {  // NaN fails both tests: off
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += weights[ids[i]];
    n = std::max<int64_t>(1, select_top_mass(ids, n, l, weights, top_p * total));
  }
  if (min_p > 0.0f && min_p <= 1.0f) {  // keep p >= min_p * p_best
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i)
      if (weights[ids[i]] >= min_p) ids[kept++] = ids[i];
    if (kept == 0) ids[kept++] = best;
    n = kept;
  }
  return n;
}

// A draw from ids[0, n) by weight, leaving out `excluded` (-1: none); -1 when nothing else
// has weight.
int32_t draw(const int32_t* ids, int64_t n, const float* weights, int32_t excluded, std::mt19937_64& rng) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] != excluded) total += weights[ids[i]];
  double target = uniform01(rng) * total;
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] == excluded) continue;
    target -= weights[ids[i]];
    if (target < 0) return ids[i];
  }
  // Rounding left a sliver: the last candidate with any weight.
  for (int64_t i = n - 1; i >= 0; --i)
    if (ids[i] != excluded && weights[ids[i]] > 0) return ids[i];
  return -1;
}

}  // namespace

int32_t sample_filtered(std::span<const float> logits, float temperature, int top_k, float top_p,
                        float min_p, std::mt19937_64& rng, std::span<int32_t> id_scratch,
                        std::span<float> weight_scratch) {
  const int32_t best = argmax(logits);
  if (!std::isfinite(logits[best])) return best;
  int32_t* ids = id_scratch.data();
  const int64_t n = candidates(logits, temperature, top_k, top_p, min_p, ids, weight_scratch.data());
  const int32_t id = draw(ids, n, weight_scratch.data(), -1, rng);
  return id >= 0 ? id : argmax(logits);
}

int32_t sample_or_accept(std::span<const float> logits, float temperature, int top_k, float top_p,
                         float min_p, int32_t proposal, std::mt19937_64& rng,
                         std::span<int32_t> id_scratch, std::span<float> weight_scratch) {
  const int32_t best = argmax(logits);
  if (!std::isfinite(logits[best])) return best;
  int32_t* ids = id_scratch.data();
  const float* weights = weight_scratch.data();
  const int64_t n = candidates(logits, temperature, top_k, top_p, min_p, ids, weight_scratch.data());
  double total = 0, proposed = 0;
  for (int64_t i = 0; i < n; ++i) {
    total += weights[ids[i]];
    if (ids[i] == proposal) proposed = weights[proposal];
  }
  // Accepted with probability p(proposal); else a draw from p without it, renormalised. So
  // p(proposal) = p(proposal) and p(x) = (1 - p(proposal)) p(x) / (1 - p(proposal)) = p(x).
  if (uniform01(rng) * total < proposed) return proposal;
  const int32_t id = draw(ids, n, weights, proposal, rng);
  return id >= 0 ? id : proposal;
}

void raw_logprobs(std::span<const float> logits, int32_t chosen, int top_n,
                  std::span<int32_t> scratch, TokenLogprob& out) {
  const int64_t vocab = int64_t(logits.size());
  const float max_logit = logits[argmax(logits)];
  double sum = 0;
  for (float l : logits) {
    double e = std::exp(double(l) - max_logit);
    if (!std::isnan(e)) sum += e;
  }
  const double log_z = max_logit + std::log(sum);
  out.id = chosen;
  out.logprob = float(double(logits[chosen]) - log_z);
  out.top.clear();
  int64_t n = std::clamp<int64_t>(top_n, 0, vocab);
  if (n == 0) return;
  int32_t* ids = scratch.data();
  for (int64_t i = 0; i < vocab; ++i) ids[i] = int32_t(i);
  std::nth_element(ids, ids + n - 1, ids + vocab, MoreLikely{logits.data()});
  std::sort(ids, ids + n, MoreLikely{logits.data()});
  for (int64_t i = 0; i < n; ++i) out.top.emplace_back(ids[i], float(double(logits[ids[i]]) - log_z));
}

Sampler::Sampler(int64_t vocab_size, int64_t max_context)
    : generated_count_(vocab_size, 0),
      in_context_(vocab_size, 0),
      work_(vocab_size),
      weights_(vocab_size),
      scratch_(vocab_size) {
  int64_t distinct = std::min(vocab_size, max_context + 1);
  context_ids_.reserve(distinct);
  generated_ids_.reserve(distinct);
}

void Sampler::start(const SamplingParams& params, std::span<const int32_t> prompt) {
  params_ = params;
  rng_.seed(params.seed ? *params.seed : std::random_device{}());
  for (int32_t id : generated_ids_) generated_count_[id] = 0;
  for (int32_t id : context_ids_) in_context_[id] = 0;
  generated_ids_.clear();
  context_ids_.clear();
  if (is_positive(params_.repetition_penalty) && params_.repetition_penalty != 1.0f)
    for (int32_t id : prompt) mark_context(id);
}

void Sampler::mark_context(int32_t id) {
  // An image's pads carry ids outside the vocabulary (engine/prompt_images.h): no token to penalise.
  if (id < 0 || size_t(id) >= in_context_.size() || in_context_[id]) return;
  in_context_[id] = 1;
  if (context_ids_.size() < context_ids_.capacity()) context_ids_.push_back(id);
}

void Sampler::accept(int32_t token) {
  if (token < 0 || size_t(token) >= generated_count_.size()) return;
  if (generated_count_[token]++ == 0 && generated_ids_.size() < generated_ids_.capacity())
    generated_ids_.push_back(token);
  if (is_positive(params_.repetition_penalty) && params_.repetition_penalty != 1.0f)
    mark_context(token);
}

bool Sampler::has_penalties() const {
  auto active = [](float x) { return std::isfinite(x) && x != 0.0f; };
  return active(params_.presence_penalty) || active(params_.frequency_penalty) ||
         (is_positive(params_.repetition_penalty) && params_.repetition_penalty != 1.0f);
}

int32_t Sampler::sample(std::span<const float> logits, int32_t proposal) {
  std::span<const float> scores = logits;
  if (has_penalties()) {
    std::copy(logits.begin(), logits.end(), work_.begin());
    apply_repetition_penalty(work_, context_ids_, params_.repetition_penalty);
    apply_presence_frequency(work_, generated_ids_, generated_count_, params_.presence_penalty,
                             params_.frequency_penalty);
    scores = work_;
  }
  if (!is_positive(params_.temperature)) return argmax(scores);
  if (proposal >= 0 && proposal < int32_t(scores.size()))
    return sample_or_accept(scores, params_.temperature, params_.top_k, params_.top_p, params_.min_p,
                            proposal, rng_, scratch_, weights_);
  return sample_filtered(scores, params_.temperature, params_.top_k, params_.top_p, params_.min_p,
                         rng_, scratch_, weights_);
}

void Sampler::logprobs(std::span<const float> logits, int32_t chosen, TokenLogprob& out) {
  raw_logprobs(logits, chosen, params_.top_logprobs, scratch_, out);
}

}  // namespace ellm
