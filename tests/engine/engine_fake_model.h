#pragma once
// A stand-in Model for scheduler tests: its "KV cache" stores the token at each position, and
// the logits at a position depend on every token the slot's cache holds up to there. So any
// scheduler bug (a stale prefix reused, a position skipped, a token fed twice) changes the
// output, and forward() checks the Model contract strictly.
//
// As a hybrid model (hybrid = true) it also keeps, per slot, a recurrent state: the hash of the
// tokens folded in so far and their count, padded to kStateBytes with bytes derived from them.
// The logits then come from that state, a pass may continue a slot only where its state ends,
// and a state that does not match the slot's KV, or whose bytes are damaged, fails the pass: so
// a session resumed without its snapshot, or with another one, cannot go unnoticed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "engine/engine.h"
#include "engine_test_util.h"
#include "model/config.h"
#include "model/model.h"

namespace ellm::testing {

class FakeModel : public Model {
 public:
  static constexpr int32_t kFirstTextId = 1000, kTextIds = 3000;  // plain BPE words
  static constexpr size_t kBytesPerToken = 1024;

  static constexpr size_t kStateBytes = 64;  // 16 positions of its "KV"

  FakeModel(int64_t vocab_size, ServingLimits limits, bool hybrid = false, bool tower = false)
      : limits_(limits), hybrid_(hybrid), tower_(tower) {
    config_.vocab_size = vocab_size;
    if (tower_) config_.hidden_size = 1;  // an image's rows: one float per pad
    if (limits_.chunk_size <= 0) limits_.chunk_size = limits_.sequence_length;
    kv_.assign(limits_.batch_size, std::vector<int32_t>(limits_.sequence_length, -1));
    fed_.assign(limits_.batch_size, 0);
    state_.assign(limits_.batch_size, std::vector<uint8_t>(kStateBytes, 0));
    state_end_.assign(limits_.batch_size, 0);
    written_.assign(limits_.batch_size, 0);
  }

  // The next-token rule: a hash of the slot's whole history.
  static constexpr uint64_t kEmptyHash = 1469598103934665603ull;
  static uint64_t fold(uint64_t h, int32_t token) { return (h ^ uint64_t(token)) * 1099511628211ull; }
  static uint64_t history_hash(std::span<const int32_t> tokens) {
    uint64_t h = kEmptyHash;
    for (int32_t t : tokens) h = fold(h, t);
    return h;
  }
  static int32_t favourite_of(uint64_t h) { return kFirstTextId + int32_t(h % kTextIds); }
  static int32_t favourite(std::span<const int32_t> tokens) { return favourite_of(history_hash(tokens)); }
  // Logits for a history: a clear favourite, a runner-up, everything else low.
  static void fill_logits(uint64_t h, float* row, int64_t vocab) {
    std::fill(row, row + vocab, -5.0f);
    for (int k = 0; k < 8; ++k) row[kFirstTextId + (h >> (8 + 5 * k)) % kTextIds] = float(k % 4);
    row[favourite_of(h)] = 10.0f;
  }

  const ModelConfig& config() const override { return config_; }
  const ServingLimits& limits() const override { return limits_; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_pass_tokens() const override { return limits_.chunk_size + limits_.batch_size; }

  void forward(std::span<const BatchToken> tokens, float* logits) override {
    if (int64_t(tokens.size()) > max_pass_tokens()) fail("fake", "too many tokens in a pass");
    if (pass_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pass_delay_ms.load()));
    std::lock_guard lock(mutex_);
    if (image_open_) ++passes_between_image_stages_;
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

  // A vision tower (tower): pads are kImagePad, an image's patches one float each, and its row k
  // is 100 + the sum of its patches + k, written by the last of kImageStages stages of
  // image_stage_delay_ms each. Passes may run between the stages; an image is never begun during
  // an open pass.
  static constexpr int32_t kImagePad = 999;
  static constexpr int kImageStages = 6;
  std::atomic<int> image_stage_delay_ms{0};
  int32_t image_token_id() const override { return tower_ ? kImagePad : -1; }
  int64_t image_patch_floats() const override { return tower_ ? 1 : 0; }
  void begin_image(const float* pixel_values, int64_t grid_t, int64_t grid_h, int64_t grid_w, float* rows) override {
    if (!tower_) Model::begin_image(pixel_values, grid_t, grid_h, grid_w, rows);
    std::lock_guard lock(mutex_);
    if (open_) fail("fake", "an image encoded during an open pass");
    image_sum_ = 0;
    for (int64_t i = 0; i < grid_t * grid_h * grid_w; ++i) image_sum_ += pixel_values[i];
    image_rows_ = rows;
    image_tokens_ = grid_t * grid_h * grid_w / 4;
    image_stage_ = 0;
    image_open_ = true;
  }
  bool image_stage() override {
    std::this_thread::sleep_for(std::chrono::milliseconds(image_stage_delay_ms.load()));
    std::lock_guard lock(mutex_);
    if (!image_open_) fail("fake", "image_stage without begin_image");
    ++image_stages_run_;
    if (++image_stage_ < kImageStages) return false;
    for (int64_t k = 0; k < image_tokens_; ++k) image_rows_[k] = 100.0f + image_sum_ + float(k);
    image_open_ = false;
    ++images_encoded_;
    return true;
  }
  int64_t images_encoded() const { return images_encoded_.load(); }
  int64_t image_stages_run() const { return image_stages_run_.load(); }
  int64_t passes_between_image_stages() const { return passes_between_image_stages_.load(); }
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
      if (tower_ && t.token == kImagePad) {  // the pad's row stands for it, so the image changes the output
        if (!t.embedding) fail("fake", "an image pad without its row");
        kv[t.position] = int32_t(t.embedding[0]);
      }
      written_[t.slot] = std::max<int64_t>(written_[t.slot], t.position + 1);
      ++fed_[t.slot];
      ++tokens_fed_;
      uint64_t h = history_hash(std::span(kv).first(t.position + 1));
      if (hybrid_) h = fold_state(t);
      if (t.want_logits) {
        fill_logits(h, logits + row * vocab_size(), vocab_size());
        ++row;
      }
    }
  }

  // The state's bytes: hash, count, then bytes derived from both.
  static void write_state(std::vector<uint8_t>& state, uint64_t h, uint64_t count) {
    std::memcpy(state.data(), &h, 8);
    std::memcpy(state.data() + 8, &count, 8);
    for (size_t i = 16; i < state.size(); ++i) state[i] = uint8_t((h >> (i % 56)) + count + i);
  }
  // Folds token t into its slot's state, checking the contract and the state's bytes; returns
  // the hash the logits come from.
  uint64_t fold_state(const BatchToken& t) {
    std::vector<uint8_t>& state = state_[t.slot];
    int64_t& end = state_end_[t.slot];
    if (t.position == 0) {
      write_state(state, kEmptyHash, 0);
    } else if (t.position != end) {
      const std::string why = "slot " + std::to_string(t.slot) + " continues at " + std::to_string(t.position) +
                              " but its recurrent state ends at " + std::to_string(end);
      end = -1;
      fail("fake", why);
    }
    uint64_t h = 0, count = 0;
    std::memcpy(&h, state.data(), 8);
    std::memcpy(&count, state.data() + 8, 8);
    std::vector<uint8_t> expected(kStateBytes);
    write_state(expected, h, count);
    if (expected != state || int64_t(count) != t.position) fail("fake", "the recurrent state is damaged");
    if (h != history_hash(std::span(kv_[t.slot]).first(t.position)))
      fail("fake", "the recurrent state does not match the KV of slot " + std::to_string(t.slot));
    h = fold(h, t.token);
    write_state(state, h, count + 1);
    end = t.position + 1;
    if (t.snapshot) std::memcpy(t.snapshot, state.data(), kStateBytes);
    return h;
  }

 public:
  bool has_recurrent_state() const override { return hybrid_; }
  size_t state_bytes_per_slot() const override { return hybrid_ ? kStateBytes : 0; }
  void state_ranges(int slot, bool for_write, std::vector<std::span<uint8_t>>& out) override {
    if (!hybrid_) return;
    std::lock_guard lock(mutex_);
    if (for_write) state_end_[slot] = -1;
    out.emplace_back(state_[slot].data(), kStateBytes);
  }
  void set_state_end(int slot, int64_t position) override {
    std::lock_guard lock(mutex_);
    uint64_t count = 0;
    std::memcpy(&count, state_[slot].data() + 8, 8);
    if (int64_t(count) != position)
      fail("fake", "a state of " + std::to_string(count) + " tokens placed at position " + std::to_string(position));
    state_end_[slot] = position;
  }
  int64_t state_end(int slot) const override {
    std::lock_guard lock(mutex_);
    return hybrid_ ? state_end_[slot] : -1;
  }
  void release_kv(int slot, int64_t from_position) override {
    std::lock_guard lock(mutex_);
    ++releases_;
    for (int64_t p = from_position; p < limits_.sequence_length; ++p) kv_[slot][p] = -1;
    written_[slot] = std::min<int64_t>(written_[slot], from_position);
    if (from_position < state_end_[slot]) state_end_[slot] = -1;
  }
  // From the positions written, not their contents: a restore may be writing a slot meanwhile.
  size_t kv_resident_bytes() const override {
    std::lock_guard lock(mutex_);
    size_t n = 0;
    for (int64_t high : written_) n += size_t(high);
    return n * kBytesPerToken;
  }
  size_t kv_bytes_per_token() const override { return kBytesPerToken; }
  size_t weight_bytes() const override { return 0; }
  // One range per slot: the tokens its "KV" holds, so a session restored wrongly changes output.
  void kv_ranges(int slot, int64_t begin, int64_t end, bool for_write,
                 std::vector<std::span<uint8_t>>& out) override {
    if (slot < 0 || slot >= limits_.batch_size || begin < 0 || begin > end || end > limits_.sequence_length)
      fail("fake", "kv_ranges outside the cache");
    if (for_write && end > 0) {
      std::lock_guard lock(mutex_);
      state_end_[slot] = -1;
      written_[slot] = std::max(written_[slot], end);
    }
    out.emplace_back(reinterpret_cast<uint8_t*>(kv_[slot].data() + begin), size_t(end - begin) * sizeof(int32_t));
  }
  std::string kv_format() const override { return hybrid_ ? "fake-kv v1 with a recurrent state" : "fake-kv v1"; }
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
  bool hybrid_ = false;
  std::vector<std::vector<int32_t>> kv_;  // [slot][position] token, -1 = not written
  std::vector<std::vector<uint8_t>> state_;  // [slot] hybrid: hash, count, derived bytes
  std::vector<int64_t> state_end_;           // [slot] where the state ends, -1: not valid
  std::vector<int64_t> written_;             // [slot] positions below this may hold KV
  std::vector<int64_t> fed_;
  std::atomic<int64_t> tokens_fed_{0}, passes_{0}, max_pass_seen_{0}, releases_{0};
  std::atomic<int64_t> split_passes_{0}, parts_run_{0}, passes_between_parts_{0};
  bool open_ = false;
  std::vector<BatchToken> open_tokens_;
  bool tower_ = false, image_open_ = false;
  float image_sum_ = 0;
  float* image_rows_ = nullptr;
  int64_t image_tokens_ = 0, image_stage_ = 0;
  std::atomic<int64_t> images_encoded_{0}, image_stages_run_{0}, passes_between_image_stages_{0};
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

// An engine over a fake model, with the model kept at hand (the engine owns it).
struct FakeEngine {
  FakeModel* model;
  std::unique_ptr<Engine> engine;
};

inline FakeEngine make_engine(ServingLimits limits, EngineOptions options = {}, bool hybrid = false,
                              bool tower = false) {
  auto model = std::make_unique<FakeModel>(test_tokenizer()->vocab_size(), limits, hybrid, tower);
  FakeModel* raw = model.get();
  if (options.eos_token_ids.empty()) options.eos_token_ids = kEos;
  return {raw, std::make_unique<Engine>(std::move(model), test_tokenizer(), options)};
}

}  // namespace ellm::testing
