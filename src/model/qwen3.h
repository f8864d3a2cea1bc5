#pragma once
// The Qwen3 / Qwen3-MoE forward pass (Hugging Face modeling_qwen3.py, modeling_qwen3_moe.py)
// over the static KV cache, with every activation buffer planned at load; and the hybrid
// Qwen3.5 generation (modeling_qwen3_5.py), whose Gated DeltaNet layers, gated attention and
// shared expert are in qwen35.cc.
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/memory.h"
#include "base/threads.h"
#include "kernels/kernels.h"
#include "model/config.h"
#include "model/gdn_rollback.h"
#include "model/gdn_state.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/profile.h"
#include "model/weights.h"

namespace ellm {

// Consecutive tokens [begin, begin + count) of one slot in a pass; `next` is the slot's next
// run in the same pass (-1: none).
struct SlotRun {
  int32_t slot, begin, count, next;
};

// Activation buffers for passes of up to max_tokens tokens, carved from one virtual
// reservation: pages commit as a pass first touches them, so the plan for a long
// sequence costs address space, not RAM.
struct Activations {
  VirtualRegion region;
  float* x;              // [T][hidden]  the residual stream
  float* step_x;         // [batch][hidden]  that of a pass run between parts of another
  float* step_rope_cos;  // [batch][head_dim / 2]
  float* step_rope_sin;
  float* xn;             // [T][hidden]  normed rows (FP32, the router's input)
  bf16* xb;              // [T][max(hidden, q_dim, ffn)]  BF16 input of the next GEMM
  float* qkv;            // [T][q_dim + 2 kv_dim]
  float* rope_cos;       // [T][head_dim / 2]  per token, shared by all layers
  float* rope_sin;       // [T][head_dim / 2]
  float* attn;           // [T][q_dim]
  float* gate_up;        // [T][2 ffn]
  float* act;            // [T][ffn]
  float* attention_scratch;
  std::vector<AttentionSeq> seqs;  // [T]
  std::vector<int32_t> want_rows;  // [T]
  // MoE: routing per token, then the token rows regrouped by expert (T * top_k rows).
  float* router_logits;      // [T][num_experts]
  int32_t* topk_expert;      // [T][top_k]
  float* topk_weight;        // [T][top_k]
  int32_t* row_of_choice;    // [T][top_k]  row of the grouped buffers holding that choice
  int32_t* token_of_row;     // [T * top_k]
  std::vector<int64_t> expert_rows;  // [num_experts + 1]  first grouped row of each expert
  bf16* moe_in;              // [T * top_k][hidden]
  float* moe_gate_up;        // [T * top_k][2 moe_ffn]
  float* moe_act;            // [T * top_k][moe_ffn]
  bf16* moe_act_b;           // [T * top_k][moe_ffn]
  float* moe_out;            // [T * top_k][hidden]
  // Qwen3.5 gated attention: the normed, rotated queries, apart from their gates.
  float* q;                  // [T][q_dim]
  // Qwen3.5 Gated DeltaNet (CD = conv_dim, VD = Hv dv).
  float* gdn_qkvz;           // [T][CD + VD]  in_proj_qkv | in_proj_z
  float* gdn_ba;             // [T][2 Hv]     in_proj_b | in_proj_a
  float* gdn_u;              // [T][CD]       conv + SiLU: q | k | v (q, k then L2-normed)
  float* gdn_g;              // [T][Hv]       log decay
  float* gdn_beta;           // [T][Hv]
  float* gdn_o;              // [T][VD]       delta-rule output, then its gated norm
  float* delta_scratch;      // [members][gated_delta_chunk_scratch_floats]
  std::vector<SlotRun> runs;       // [T]  runs of consecutive tokens of one slot
  std::vector<int32_t> first_runs;  // [T]  the first run of each slot in the pass
  // Qwen3.5 shared expert.
  float* shared_gate_up;     // [T][2 shared_ffn]
  float* shared_out;         // [T][hidden]
  // MTP head (mtp.cc): its input rows [norm(embedding) | norm(hidden)], their FP32 scratch,
  // its tokens and the hidden state each pairs with.
  bf16* mtp_in;                           // [T][2 hidden]
  float* mtp_scratch;                     // [T][hidden]
  std::vector<BatchToken> mtp_tokens;     // [T]
  std::vector<const float*> mtp_hidden;   // [T]
};

// The rows one part of a pass works on.
struct PassRows {
  std::span<const BatchToken> tokens;  // [n]
  float* x;                            // [n][hidden]  their residual stream
  float* rope_cos;                     // [n][head_dim / 2]
  float* rope_sin;
};

class Qwen3Model final : public Model {
 public:
  Qwen3Model(const std::string& model_dir, const ModelConfig& config, const ServingLimits& limits,
             std::shared_ptr<ThreadTeam> team);

  const ModelConfig& config() const override { return config_; }
  const ServingLimits& limits() const override { return limits_; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_pass_tokens() const override { return max_tokens_; }
  void forward(std::span<const BatchToken> tokens, float* logits) override;
  void begin_pass(std::span<const BatchToken> tokens) override;
  bool run_part(int64_t max_rows, float* logits) override;
  void cancel_pass() override;
  void release_kv(int slot, int64_t from_position) override;
  size_t kv_resident_bytes() const override { return kv_.resident_bytes(); }
  size_t kv_bytes_per_token() const override { return kv_.bytes_per_token(); }
  bool has_recurrent_state() const override { return config_.is_hybrid(); }
  size_t state_bytes_per_slot() const override { return state_.bytes_per_slot(); }
  void state_ranges(int slot, bool for_write, std::vector<std::span<uint8_t>>& out) override;
  void set_state_end(int slot, int64_t position) override;
  int64_t state_end(int slot) const override;
  size_t weight_bytes() const override { return weights_.bytes; }
  void kv_ranges(int slot, int64_t begin, int64_t end, bool for_write,
                 std::vector<std::span<uint8_t>>& out) override;
  std::string kv_format() const override;
  uint64_t fingerprint() const override { return fingerprint_; }
  void set_profile_sink(ProfileSink* sink) override;
  void accept(int slot, int64_t end) override;
  bool has_mtp() const override { return limits_.mtp; }
  void mtp_forward(std::span<const BatchToken> tokens, float* logits) override;
  const std::shared_ptr<ThreadTeam>& team() const { return team_owner_; }

 private:
  void validate(std::span<const BatchToken> tokens) const;
  // Hybrid models: checks that each slot of the pass continues where its state ends (or starts
  // over at 0: then resets it), and moves the ends past the pass.
  void claim_state(std::span<const BatchToken> tokens);
  void forget_state(std::span<const BatchToken> tokens);
  // Speculative groups: checks that the pass extends them (and opens new ones) by the rules of
  // Model::accept, into spec_claim_; then claim_groups() makes it so (hybrid models keep the
  // state a new group starts from).
  void check_groups(std::span<const BatchToken> tokens);
  void claim_groups();
  void close_group(int slot);
  // gdn_rollback.cc: what a Gated DeltaNet layer took in for each speculative token.
  void record_speculative(int64_t layer, const PassRows& rows);
  // mtp.cc: the MTP head over a finished pass (its KV), and its drafting rows.
  void mtp_after_pass(const PassRows& rows);
  void mtp_inputs(int64_t n, float* rope_cos, float* rope_sin);
  void mtp_layer(int64_t n, float* x, float* rope_cos, float* rope_sin);
  void mtp_accept(int slot, int64_t end);
  const float* mtp_saved_hidden(int slot, int64_t position) const;
  void plan_activations();
  // fn(begin, end) on each member's share of [0, n) rows.
  template <class Fn>
  void rows(int64_t n, Fn&& fn) {
    team_.run([&](int member, int n_members) {
      auto [begin, end] = split_range(n, member, n_members);
      if (begin < end) fn(begin, end);
    });
  }
  // y (+)= x @ W^T on every member, timed as `op`; decode-sized products share out their last
  // quarter as the members go (matmul_pool_).
  void gemm(Op op, const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
            int64_t ldy, bool accumulate) {
    profiler_.time(op, 2.0 * double(m) * double(w.n) * double(w.k), double(w.bytes), [&] {
      matmul_pool_.store(0, std::memory_order_relaxed);  // run() publishes it to the members
      team_.run([&](int member, int n) {
        matmul(x, m, ldx, w, y, ldy, accumulate, member, n, &matmul_pool_);
      });
    });
  }
  void commit_and_embed(const PassRows& rows);
  void layer(int64_t l, const PassRows& rows);
  void norm_to_bf16(const float* weight, const float* x, int64_t n);
  void attention_block(int64_t layer, const PassRows& rows);
  void qk_norm_rope_to_cache(int64_t layer, const PassRows& rows);  // Qwen3
  // qwen35.cc: the Qwen3.5 parts.
  void gated_qk_norm_rope_to_cache(int64_t layer, const PassRows& rows);
  void apply_output_gate(const PassRows& rows);
  void gdn_block(int64_t layer, const PassRows& rows);
  int64_t find_slot_runs(std::span<const BatchToken> tokens);
  void shared_expert(const MoeWeights& moe, float* x, int64_t n);
  void mlp_block(const SwiGluWeights& mlp, float* x, int64_t n);
  void moe_block(const MoeWeights& moe, float* x, int64_t n);
  void lm_head(const PassRows& rows, float* logits);
  void report_pass();

  ModelConfig config_;
  ServingLimits limits_;
  int64_t max_tokens_;
  std::shared_ptr<ThreadTeam> team_owner_;  // shared by a draft model and its target
  ThreadTeam& team_;
  ModelWeights weights_;
  KvCache kv_;                     // full-attention layers only
  std::vector<int64_t> kv_layer_;  // [layers]  a layer's index in kv_ (-1: none)
  GdnState state_;                 // Gated DeltaNet layers only
  std::vector<int64_t> gdn_layer_;  // [layers]  a layer's index in state_ (-1: none)
  std::vector<int64_t> state_end_;  // [batch]  tokens folded into a slot's state (-1: garbage)
  std::vector<int64_t> claim_end_;  // [batch]  claim_state's scratch
  std::vector<char> claim_reset_;   // [batch]
  // A slot's speculative tokens since its last accept(): positions [begin, begin + count).
  struct SpeculativeGroup {
    int64_t begin = 0, count = 0;
  };
  std::vector<SpeculativeGroup> spec_, spec_claim_;  // [batch]; spec_claim_: check_groups' result
  std::vector<char> spec_opens_;                     // [batch]  a group opens in this pass
  GdnRollback rollback_;  // hybrid models with speculative_tokens: the states groups start from
  // MTP head: per slot the final-normed hidden states of its last pass (the group's rows, or
  // the last row) at positions [mtp_first_, mtp_first_ + mtp_rows_), and the head's own output
  // after its last mtp_forward row, at mtp_chain_position_.
  Buffer<float> mtp_hidden_;  // [batch][speculative_tokens + 1][hidden]
  Buffer<float> mtp_chain_;   // [batch][hidden]
  std::vector<int64_t> mtp_first_, mtp_rows_, mtp_chain_position_;  // [batch]
  std::vector<float> inv_freq_;  // [rotary_dim / 2]
  AttentionShape attention_shape_;
  Activations act_;
  struct OpenPass {  // begin_pass .. the part that ends it
    bool open = false;
    std::vector<BatchToken> tokens;  // capacity max_tokens_, reserved at load
    std::vector<char> has_slot;      // [batch]
    int64_t layer = 0, row = 0;
  } pass_;
  std::atomic<uint64_t> expert_bytes_read_{0};  // by the MoE layers of this pass
  int64_t solo_reported_ = 0;                   // the team's solo switches at the last report
  alignas(64) std::atomic<int64_t> matmul_pool_{0};  // its own cache line: both members add to it
  OpProfiler profiler_;
  uint64_t fingerprint_ = 0;
};

}  // namespace ellm
