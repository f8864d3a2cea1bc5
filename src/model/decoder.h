#pragma once
// What every decoder-only architecture shares: the serving limits, the thread team, the slots'
// sequence memory, the embedding, the final norm and lm_head, and the pass machinery (a pass
// whole or in parts, checked and claimed against the slots' memory). An architecture derives
// from Decoder, loads its own weights, and supplies its decoder layer:
//   x = embed(tokens); for each layer l: layer(l, rows); logits = lm_head(norm(x))
// An architecture may widen the residual to several streams of hidden values each (streams_,
// every stream starting as the embedding) and replace the final norm (lm_head_input).
// All buffers are planned at load for the largest pass; a pass allocates nothing.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/memory.h"
#include "base/threads.h"
#include "kernels/kernels.h"
#include "model/blocks/context.h"
#include "model/config.h"
#include "model/load/safetensors.h"
#include "model/load/tensor_loader.h"
#include "model/memory/sequence_memory.h"
#include "model/model.h"
#include "model/rope.h"
#include "model/vision/vision_tower.h"

namespace ellm {

// The weights around the decoder layers; an architecture's weights derive from it.
struct DecoderWeights {
  SafetensorsStore store;           // keeps the mapped embedding alive
  const bf16* embedding = nullptr;  // [vocab][hidden]
  Buffer<bf16> embedding_copy;      // when the checkpoint is not BF16
  Buffer<float> final_norm;         // [hidden]
  PackedWeights lm_head;            // [vocab][hidden] (packed from the embedding when tied)
  size_t bytes = 0;         // packed matrices + embedding + norms
  size_t expert_bytes = 0;  // all experts of all layers (part of bytes)
  size_t fp8_bytes = 0;     // the FP8 matrices' codes and factors (part of bytes)
  size_t int4_bytes = 0;    // the INT4 matrices' codes, factors and zeros (part of bytes)
};

// How load_decoder_weights reads a checkpoint.
struct WeightOptions {
  Isa isa = Isa::scalar;
  bool quantize_fp8 = false, quantize_int4 = false, quantize_lm_head = false;
  bool mtp = false;  // read the multi-token-prediction head's tensors (mtp.*) too
  bool final_norm = true;  // read <prefix>norm.weight (an architecture with a final mixer has none)
  // Tensors (by name prefix under the text model's root) the architecture leaves in the mapping
  // without reading them whole (the n-gram table): not counted in the load's progress.
  std::vector<std::string> left_mapped;
};

// Opens the checkpoint, and calls load_layers(loader, prefix) between the embedding and the
// final norm and lm_head (prefix: where the text model's tensors are, "model." or Qwen3.5's
// "model.language_model."). norm reads a norm weight as the architecture applies it.
void load_decoder_weights(const std::string& model_dir, const ModelConfig& config,
                          const WeightOptions& options, NormReader norm, DecoderWeights& weights,
                          const std::function<void(TensorLoader&, const std::string&)>& load_layers);

using MatrixFn = std::function<void(PackedWeights&)>;

class Decoder : public Model {
 public:
  const ModelConfig& config() const override { return config_; }
  const ServingLimits& limits() const override { return limits_; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_pass_tokens() const override { return max_tokens_; }
  void forward(std::span<const BatchToken> tokens, float* logits) override;
  void begin_pass(std::span<const BatchToken> tokens) override;
  bool run_part(int64_t max_rows, float* logits) override;
  void cancel_pass() override;
  void release_kv(int slot, int64_t from_position) override { memory_.release(slot, from_position); }
  size_t kv_resident_bytes() const override { return memory_.kv().resident_bytes(); }
  size_t kv_bytes_per_token() const override { return memory_.kv().bytes_per_token(); }
  bool bf16_attention_products() const override { return bf16_attention_used_; }
  bool has_recurrent_state() const override { return memory_.has_state(); }
  size_t state_bytes_per_slot() const override;
  void state_ranges(int slot, bool for_write, std::vector<std::span<uint8_t>>& out) override {
    memory_.state_ranges(slot, for_write, out);
  }
  void set_state_end(int slot, int64_t position) override { memory_.set_state_end(slot, position); }
  int64_t state_end(int slot) const override { return memory_.state_end(slot); }
  size_t weight_bytes() const override { return decoder_weights_->bytes; }
  void kv_ranges(int slot, int64_t begin, int64_t end, bool for_write,
                 std::vector<std::span<uint8_t>>& out) override {
    memory_.kv_ranges(slot, begin, end, for_write, team_, out);
  }
  uint64_t fingerprint() const override { return fingerprint_; }
  void set_profile_sink(ProfileSink* sink) override;
  void accept(int slot, int64_t end) override;
  std::shared_ptr<ThreadTeam> thread_team() const override { return team_owner_; }
  // Images, where the folder has a vision tower (load_tower).
  int32_t image_token_id() const override { return tower_ ? config_.image_token_id : -1; }
  int64_t image_patch_floats() const override { return tower_ ? tower_->config().patch_values() : 0; }
  void begin_image(const float* pixel_values, int64_t grid_t, int64_t grid_h, int64_t grid_w,
                   float* rows) override;
  bool image_stage() override;

 protected:
  Decoder(const ModelConfig& config, const ServingLimits& limits, std::shared_ptr<ThreadTeam> team);

  // The architecture's part of a pass and of the plan.
  virtual void layer(int64_t l, const PassRows& rows) = 0;  // one decoder layer over the rows
  virtual void plan(ActivationPlan& plan) = 0;               // its blocks' buffers
  virtual void after_pass(const PassRows& rows) {}           // after the last layer and lm_head
  virtual void for_each_matrix(const MatrixFn& fn) = 0;      // every packed matrix, for --activations
  virtual void describe(std::string& load_line) const {}     // appended to the load line
  // The lm_head's inputs, normed_.xn's rows [0, n), from the residual rows
  // x + rows[i] * residual_width(): by default the final RMSNorm.
  virtual void lm_head_input(const float* x, const int32_t* rows, int64_t n);

  // Once the architecture has loaded its weights: the slots' memory, the plan and the load
  // line. widest_input: the widest row of any matrix product's input (the BF16 scratch).
  void finish_load(const std::string& model_dir, DecoderWeights& weights, const MemoryShape& memory,
                   int64_t widest_input);

  size_t automatic_kv_budget() const;  // --kv-memory's default: what RAM allows

  // The folder's vision tower (model.visual.*, Qwen3.5+), unless it has none or
  // limits_.language_model_only; its rows replace the <|image_pad|> embeddings (BatchToken).
  void load_tower(const std::string& model_dir);
  void describe_tower(std::string& load_line) const;
  std::unique_ptr<VisionTower> tower_;  // null: text only

  // Whether attention runs on BF16 products (--attention-products bf16 with an FP16 cache, on a
  // tier that has them): an architecture that honours it asks here for its AttentionSpec; the
  // load line and the KV format then say so (the KV rows of later layers depend on it).
  bool bf16_attention();
  std::string bf16_attention_tag() const { return bf16_attention_used_ ? " attention=bf16" : ""; }
  bool bf16_attention_used_ = false;

  // Checks a pass's tokens against the limits (Model::forward's errors).
  void validate(std::span<const BatchToken> tokens) const;
  void lm_head(const PassRows& rows, float* logits);

  ModelConfig config_;
  ServingLimits limits_;  // kv_memory_bytes resolved at finish_load (automatic_kv_budget)
  int64_t max_tokens_;
  std::shared_ptr<ThreadTeam> team_owner_;  // shared by a draft model and its target
  ThreadTeam& team_;
  BlockContext ctx_;
  SequenceMemory memory_;
  int64_t streams_ = 1;   // residual streams per token; set before finish_load
  int64_t residual_width() const { return streams_ * config_.hidden_size; }
  // Buffers every architecture's pass uses.
  float* x_;              // [T][streams_ hidden]  the residual stream(s)
  float* step_x_;         // [batch][streams_ hidden]  that of a pass run between parts of another
  float* step_rope_cos_;  // [batch][head_dim / 2]
  float* step_rope_sin_;
  float* rope_cos_;  // [T][head_dim / 2]  per token, shared by all layers
  float* rope_sin_;
  NormedRows normed_;  // [T][hidden], [T][widest_input]
  RopeTable rope_;  // the frequencies of the rotary dims, YaRN's attention factor
  bool pass_open() const { return pass_.open; }

 private:
  void commit_and_embed(const PassRows& rows);
  void run_short_pass(std::span<const BatchToken> tokens, float* logits);
  void report_pass();

  DecoderWeights* decoder_weights_ = nullptr;
  ActivationPlan plan_;
  std::vector<int32_t> want_rows_;  // [T]
  struct OpenPass {  // begin_pass .. the part that ends it
    bool open = false;
    std::vector<BatchToken> tokens;  // capacity max_tokens_, reserved at load
    std::vector<char> has_slot;      // [batch]
    int64_t layer = 0, row = 0;
  } pass_;
  std::chrono::steady_clock::time_point load_start_;
  int64_t solo_reported_ = 0;  // the team's solo switches at the last report
  TeamTime team_reported_;     // its timing at the last report
  uint64_t fingerprint_ = 0;
};

}  // namespace ellm
