#pragma once
// Per-operation time and work of forward passes, sent to the ProfileSink a benchmark sets
// (model.h). Without a sink an operation costs one branch; with one, two clock reads.
#include <chrono>
#include <cstddef>

#include "model/model.h"

namespace ellm {

enum class Op {
  embed,
  kv_commit,
  norm,
  qkv,
  qk_norm_rope,
  attention,
  o_proj,
  gate_up,
  silu_mul,
  down,
  moe_router,
  moe_experts,
  moe_combine,
  lm_head,
  gdn_conv,   // Gated DeltaNet: causal conv + SiLU
  gdn_gates,  // L2 norms of q and k, beta and g
  gdn_delta,  // the delta rule
  gdn_norm,   // the gated output norm
  gate_mul,   // gated attention: o * sigmoid(gate)
  mtp_fc,     // the MTP head's input product
  hyper_mix,  // hyper-connections: a block's input mixed from the residual streams
  ngram_gather,  // the n-gram table's rows
  ngram_proj,    // the n-gram module's projections, gates and norms
  indexer,    // sparse attention: the indexer's block scores
  count
};

class OpProfiler {
 public:
  void set_sink(ProfileSink* sink) { sink_ = sink; }
  ProfileSink* sink() const { return sink_; }

  template <class Fn>
  void time(Op op, double flops, double bytes, Fn&& fn) {
    if (!sink_) {
      fn();
      return;
    }
    auto start = std::chrono::steady_clock::now();
    fn();
    add(op, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), flops, bytes);
  }
  // An op its caller timed (a share of a team's run).
  void add(Op op, double seconds, double flops, double bytes) {
    if (!sink_) return;
    static const char* names[] = {"embed",   "kv_commit", "norm",       "qkv",         "qk_norm_rope",
                                  "attention", "o_proj", "gate_up",    "silu_mul",    "down",
                                  "moe_router", "moe_experts", "moe_combine", "lm_head",
                                  "gdn_conv",  "gdn_gates",   "gdn_delta",   "gdn_norm",
                                  "gate_mul",  "mtp_fc",      "hyper_mix",   "ngram_gather",
                                  "ngram_proj", "indexer"};
    static_assert(sizeof(names) / sizeof(names[0]) == size_t(Op::count));
    bool gemm = op == Op::qkv || op == Op::o_proj || op == Op::gate_up || op == Op::down ||
                op == Op::moe_experts || op == Op::lm_head || op == Op::mtp_fc;
    sink_->op(names[size_t(op)], gemm, seconds, flops, bytes);
  }

 private:
  ProfileSink* sink_ = nullptr;
};

}  // namespace ellm
