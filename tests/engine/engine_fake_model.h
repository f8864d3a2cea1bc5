#pragma once
// A stand-in Model for scheduler tests: its "KV cache" stores the token at each position, and
// the logits at a position depend on every token the slot's cache holds up to there. So any
// scheduler bug (a stale prefix reused, a position skipped, a token fed twice) changes the
// output, and forward() checks the Model contract strictly.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "model/config.h"
#include "model/model.h"

namespace ellm::testing {

class FakeModel : public Model {
 public:
  static constexpr int32_t kFirstTextId = 1000, kTextIds = 3000;  // plain BPE words
  static constexpr size_t kBytesPerToken = 1024;

  FakeModel(int64_t vocab_size, ServingLimits limits) : limits_(limits) {
    config_.vocab_size = vocab_size;
    if (limits_.chunk_size <= 0) limits_.chunk_size = limits_.sequence_length;
    kv_.assign(limits_.batch_size, std::vector<int32_t>(limits_.sequence_length, -1));
    fed_.assign(limits_.batch_size, 0);
  }

  // The next-token rule: a hash of the slot's whole history.
  static uint64_t history_hash(std::span<const int32_t> tokens) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : tokens) h = (h ^ uint64_t(t)) * 1099511628211ull;
    return h;
  }
  static int32_t favourite(std::span<const int32_t> tokens) {
    return kFirstTextId + int32_t(history_hash(tokens) % kTextIds);
  }
  // Logits for a history: a clear favourite, a runner-up, everything else low.
  static void fill_logits(std::span<const int32_t> tokens, float* row, int64_t vocab) {
    std::fill(row, row + vocab, -5.0f);
    uint64_t h = history_hash(tokens);
    for (int k = 0; k < 8; ++k) row[kFirstTextId + (h >> (8 + 5 * k)) % kTextIds] = float(k % 4);
    row[favourite(tokens)] = 10.0f;
  }

  const ModelConfig& config() const override { return config_; }
  const ServingLimits& limits() const override { return limits_; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_pass_tokens() const override { return limits_.chunk_size + limits_.batch_size; }

  void forward(std::span<const BatchToken> tokens, float* logits) override {
    if (int64_t(tokens.size()) > max_pass_tokens()) fail("fake", "too many tokens in a pass");
    std::lock_guard lock(mutex_);
    ++passes_;
    max_pass_seen_ = std::max<int64_t>(max_pass_seen_, int64_t(tokens.size()));
    int64_t row = 0;
    for (const BatchToken& t : tokens) {
      if (t.token < 0 || t.token >= vocab_size()) fail("fake", "token outside the vocabulary");
      if (t.token == poison_token) fail("fake", "poisoned token");
      if (t.slot < 0 || t.slot >= limits_.batch_size) fail("fake", "bad slot");
      if (t.position < 0 || t.position >= limits_.sequence_length) fail("fake", "bad position");
      auto& kv = kv_[t.slot];
      for (int32_t p = 0; p < t.position; ++p)
        if (kv[p] < 0) fail("fake", "KV before position " + std::to_string(t.position) + " not written");
      kv[t.position] = t.token;
      ++fed_[t.slot];
      ++tokens_fed_;
      if (t.want_logits) {
        fill_logits(std::span(kv).first(t.position + 1), logits + row * vocab_size(), vocab_size());
        ++row;
      }
    }
  }

  void release_kv(int slot, int64_t from_position) override {
    std::lock_guard lock(mutex_);
    ++releases_;
    for (int64_t p = from_position; p < limits_.sequence_length; ++p) kv_[slot][p] = -1;
  }
  size_t kv_resident_bytes() const override {
    std::lock_guard lock(mutex_);
    size_t n = 0;
    for (auto& kv : kv_) n += std::count_if(kv.begin(), kv.end(), [](int32_t t) { return t >= 0; });
    return n * kBytesPerToken;
  }
  size_t kv_bytes_per_token() const override { return kBytesPerToken; }
  size_t weight_bytes() const override { return 0; }
  // One range per slot: the tokens its "KV" holds, so a session restored wrongly changes output.
  void kv_ranges(int slot, int64_t begin, int64_t end, bool for_write,
                 std::vector<std::span<uint8_t>>& out) override {
    if (slot < 0 || slot >= limits_.batch_size || begin < 0 || begin > end || end > limits_.sequence_length)
      fail("fake", "kv_ranges outside the cache");
    out.emplace_back(reinterpret_cast<uint8_t*>(kv_[slot].data() + begin), size_t(end - begin) * sizeof(int32_t));
  }
  std::string kv_format() const override { return "fake-kv v1"; }
  uint64_t fingerprint() const override { return fingerprint_; }
  uint64_t fingerprint_ = 42;

  // Observations for tests (read after the engine went quiet).
  int64_t tokens_fed() const { return tokens_fed_.load(); }
  int64_t passes() const { return passes_.load(); }
  int64_t max_pass_seen() const { return max_pass_seen_.load(); }
  int64_t releases() const { return releases_.load(); }
  std::atomic<int32_t> poison_token{-1};

 private:
  ModelConfig config_;
  ServingLimits limits_;
  mutable std::mutex mutex_;
  std::vector<std::vector<int32_t>> kv_;  // [slot][position] token, -1 = not written
  std::vector<int64_t> fed_;
  std::atomic<int64_t> tokens_fed_{0}, passes_{0}, max_pass_seen_{0}, releases_{0};
};

// The greedy continuation the fake model implies for a prompt.
inline std::vector<int32_t> fake_greedy(std::vector<int32_t> tokens, int64_t n) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(FakeModel::favourite(tokens));
    tokens.push_back(out.back());
  }
  return out;
}

}  // namespace ellm::testing
