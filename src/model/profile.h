#pragma once
// Per-operation time and work of forward passes, for `ellm bench`. Off by default: then an
// operation costs one branch; on, two clock reads.
#include <array>
#include <chrono>

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
  count
};

class OpProfiler {
 public:
  void enable(bool on) { on_ = on; }
  void reset() { totals_ = {}; }

  template <class Fn>
  void time(Op op, double flops, double bytes, Fn&& fn) {
    if (!on_) {
      fn();
      return;
    }
    auto start = std::chrono::steady_clock::now();
    fn();
    Total& t = totals_[size_t(op)];
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    t.flops += flops;
    t.bytes += bytes;
  }

  ForwardProfile snapshot() const {
    static const char* names[] = {
        "embed",    "kv_commit", "norm", "qkv",        "qk_norm_rope", "attention",   "o_proj", "gate_up",
        "silu_mul", "down", "moe_router", "moe_experts",  "moe_combine", "lm_head"};
    ForwardProfile p;
    for (size_t i = 0; i < size_t(Op::count); ++i) {
      if (totals_[i].seconds == 0) continue;
      Op op = Op(i);
      bool gemm = op == Op::qkv || op == Op::o_proj || op == Op::gate_up || op == Op::down ||
                  op == Op::moe_experts || op == Op::lm_head;
      p.ops.push_back({names[i], totals_[i].seconds, totals_[i].flops, totals_[i].bytes, gemm});
    }
    return p;
  }

 private:
  struct Total {
    double seconds = 0, flops = 0, bytes = 0;
  };
  bool on_ = false;
  std::array<Total, size_t(Op::count)> totals_{};
};

}  // namespace ellm
