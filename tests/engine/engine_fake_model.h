#pragma once
// A stand-in Model for scheduler tests: its "KV cache" stores the token at each position, and
// the logits at a position depend on every token the slot's cache holds up to there. So any
// scheduler bug (a stale prefix reused, a position skipped, a token fed twice) changes the
// output, and forward() checks the Model contract strictly.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <thread>
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
    if (pass_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pass_delay_ms.load()));
    std::lock_guard lock(mutex_);
    if (open_) {  // the contract for a pass between the parts of another
      if (int64_t(tokens.size()) > limits_.batch_size) fail("fake", "too many tokens between parts");
      for (const BatchToken& t : tokens)
        for (const BatchToken& o : open_tokens_)
          if (t.slot == o.slot) fail("fake", "a slot of the open pass in a pass between its parts");
      ++passes_between_parts_;
    }
    feed(tokens, logits);
  }

  // Parts: kLayers "layers" of the pass's rows, each part max_rows of them (not past the end
  // of a layer), part_delay_us_per_row each; the tokens are fed (KV written, logits filled) by
  // the part that ends the pass.
  static constexpr int64_t kLayers = 4;
  void begin_pass(std::span<const BatchToken> tokens) override {
    if (int64_t(tokens.size()) > max_pass_tokens()) fail("fake", "too many tokens in a pass");
    std::lock_guard lock(mutex_);
    if (open_) fail("fake", "a pass is already open");
    open_tokens_.assign(tokens.begin(), tokens.end());
    layer_ = row_ = 0;
    open_ = !tokens.empty();
    ++split_passes_;
  }
  bool run_part(int64_t max_rows, float* logits) override {
    if (max_rows <= 0) fail("fake", "a part needs rows");
    std::lock_guard lock(mutex_);
    if (!open_) return true;
    ++parts_run_;
    const int64_t end = std::min<int64_t>(int64_t(open_tokens_.size()), row_ + max_rows);
    std::this_thread::sleep_for(std::chrono::microseconds(part_delay_us_per_row * (end - row_)));
    row_ = end;
    if (row_ == int64_t(open_tokens_.size())) {
      row_ = 0;
      ++layer_;
    }
    if (layer_ < kLayers) return false;
    open_ = false;
    feed(open_tokens_, logits);
    return true;
  }
  void cancel_pass() override {
    std::lock_guard lock(mutex_);
    open_ = false;
    ++cancelled_passes_;
  }
  std::atomic<int> part_delay_us_per_row{0}, pass_delay_ms{0};  // slow parts and passes down
  std::atomic<int64_t> cancelled_passes_{0};

 private:
  void feed(std::span<const BatchToken> tokens, float* logits) {
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

 public:
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
  int64_t split_passes() const { return split_passes_.load(); }
  int64_t parts_run() const { return parts_run_.load(); }
  int64_t passes_between_parts() const { return passes_between_parts_.load(); }
  std::atomic<int32_t> poison_token{-1};

 private:
  ModelConfig config_;
  ServingLimits limits_;
  mutable std::mutex mutex_;
  std::vector<std::vector<int32_t>> kv_;  // [slot][position] token, -1 = not written
  std::vector<int64_t> fed_;
  std::atomic<int64_t> tokens_fed_{0}, passes_{0}, max_pass_seen_{0}, releases_{0};
  std::atomic<int64_t> split_passes_{0}, parts_run_{0}, passes_between_parts_{0};
  bool open_ = false;
  std::vector<BatchToken> open_tokens_;
  int64_t layer_ = 0, row_ = 0;
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
