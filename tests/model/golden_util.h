#pragma once
// The golden sessions of shared/golden and the pass rule of its README.md.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model_test_util.h"

namespace ellm::test {

struct Golden {
  nlohmann::json session;
  std::vector<std::vector<int32_t>> feeds;
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_logits, lse;
  int64_t vocab, positions, topk;

  explicit Golden(const std::string& name) {
    std::string dir = shared_dir() + "/golden/" + name;
    session = nlohmann::json::parse(read_text(dir + "/session.json"));
    feeds = session["feeds"].get<std::vector<std::vector<int32_t>>>();
    vocab = session["vocab_size"];
    positions = session["positions"];
    topk = session["topk"];
    topk_ids = read_binary<int32_t>(dir + "/session_topk_ids.i32");
    topk_logits = read_binary<float>(dir + "/session_topk_logits.f32");
    lse = read_binary<float>(dir + "/session_lse.f32");
  }
};

struct Score {
  std::vector<double> err;  // per position
  double fraction_within = 0, fraction_within_3atol = 0;
  int argmax_mismatches = 0;  // at clear-margin positions within atol
  int clear_margin_mismatches = 0;  // at every clear-margin position
  double max_dlogit = 0;  // the largest |engine - reference| over every position's top-k ids
  double percentile(double p) const {
    std::vector<double> sorted = err;
    std::sort(sorted.begin(), sorted.end());
    return sorted[std::min(sorted.size() - 1, size_t(p * double(sorted.size())))];
  }
};

// The rule of shared/golden/README.md.
inline Score score(const Golden& g, const std::vector<float>& logits) {
  Score s;
  const double atol = g.session["atol"], margin_min = g.session["margin_min"];
  int within = 0, within_3 = 0;
  for (int64_t p = 0; p < g.positions; ++p) {
    const float* row = logits.data() + p * g.vocab;
    double max_logit = *std::max_element(row, row + g.vocab), sum = 0;
    for (int64_t v = 0; v < g.vocab; ++v) sum += std::exp(double(row[v]) - max_logit);
    double lse = max_logit + std::log(sum);
    double worst = 0;
    for (int64_t j = 0; j < g.topk; ++j)
      worst = std::max(worst, std::abs(double(row[g.topk_ids[p * g.topk + j]]) -
                                       double(g.topk_logits[p * g.topk + j])));
    s.max_dlogit = std::max(s.max_dlogit, worst);
    double err = worst + std::abs(lse - double(g.lse[p]));
    s.err.push_back(err);
    within += err <= atol;
    within_3 += err <= 3 * atol;
    int64_t argmax = std::max_element(row, row + g.vocab) - row;
    const bool clear = double(g.session["reference_margin"][p]) > margin_min;
    const bool kept = argmax == g.session["reference_argmax"][p].get<int64_t>();
    s.argmax_mismatches += clear && err <= atol && !kept;
    s.clear_margin_mismatches += clear && !kept;
  }
  s.fraction_within = double(within) / double(g.positions);
  s.fraction_within_3atol = double(within_3) / double(g.positions);
  return s;
}

// Feeds the chunks in order into one slot; returns [positions][vocab] logits.
inline std::vector<float> run_feeds(Model& model, const std::vector<std::vector<int32_t>>& feeds,
                                    int slot = 0) {
  const int64_t V = model.vocab_size();
  std::vector<float> logits;
  std::vector<BatchToken> batch;
  int32_t position = 0;
  for (const auto& chunk : feeds) {
    batch.clear();
    for (int32_t id : chunk) batch.push_back({id, slot, position++, true});
    size_t at = logits.size();
    logits.resize(at + chunk.size() * size_t(V));
    model.forward(batch, logits.data() + at);
  }
  return logits;
}

}  // namespace ellm::test
