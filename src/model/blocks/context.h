#pragma once
// What every block of a forward pass works with: the thread team that runs it, the profiler
// that times it, and the rows of the pass it works on; and the activation plan, which carves
// every block's buffers out of one virtual reservation once, at load, for the largest pass.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <span>
#include <type_traits>

#include "base/memory.h"
#include "base/threads.h"
#include "kernels/kernels.h"
#include "model/load/small_matrix.h"
#include "model/model.h"
#include "model/profile.h"

namespace ellm {

// Where a pass widens the SmallMatrix weights of its products (planned by an architecture that
// has them, plan_small_matrix_scratch): a long pass widens a whole matrix once for all members;
// a short one widens each member's BF16 rows a tile at a time (FP8 rows in registers,
// dot_rows_fp8).
struct SmallMatrixScratch {
  float* whole = nullptr;   // [the most elements of any small matrix]
  float* tiles = nullptr;   // [members][tile_floats]
  int64_t tile_floats = 0;
  static constexpr int64_t kTileFloats = 32768;  // a tile's rows: this many floats, at least 4 rows
  static int64_t tile_rows(int64_t dim) { return std::max<int64_t>(4, kTileFloats / dim / 4 * 4); }
};

class BlockContext {
 public:
  explicit BlockContext(ThreadTeam& team) : team(team) {}

  // fn(begin, end) on each member's share of [0, n) rows.
  template <class Fn>
  void rows(int64_t n, Fn&& fn) {
    team.run([&](int member, int n_members) {
      auto [begin, end] = split_range(n, member, n_members);
      if (begin < end) fn(begin, end);
    });
  }
  // out[t][r] = x[t] . w[r] (dot_rows_f32) for n rows of x and `rows` rows of w, on every
  // member: a long pass splits its rows of x, a short one (a decode step, a speculative group)
  // the rows of w, so that every member reads a share of the weights. Each output is the same
  // bits either way.                        x: [n][dim] at ldx   w: [rows][dim]   out: at ldo
  void dot_rows(const float* x, int64_t n, int64_t ldx, const float* w, int64_t rows, int64_t dim,
                float* out, int64_t ldo) {
    team.run([&](int member, int n_members) {
      if (n >= kRowsPerMemberToSplitTokens * n_members) {
        auto [begin, end] = split_range(n, member, n_members);
        if (begin < end) dot_rows_f32(x + begin * ldx, end - begin, ldx, w, rows, dim, out + begin * ldo, ldo);
      } else {
        auto [begin, end] = split_range(rows, member, n_members);
        if (begin < end) dot_rows_f32(x, n, ldx, w + begin * dim, end - begin, dim, out + begin, ldo);
      }
    });
  }
  static constexpr int64_t kRowsPerMemberToSplitTokens = 16;
  // The same over a SmallMatrix, widened in `small` (the same bits as over the FP32 matrix).
  void dot_rows(const float* x, int64_t n, int64_t ldx, const SmallMatrix& w, float* out, int64_t ldo) {
    if (w.dtype == Dtype::f32) return dot_rows(x, n, ldx, w.f32.get(), w.rows, w.dim, out, ldo);
    if (n >= kRowsPerMemberToSplitTokens * team.size()) {
      team.run([&](int member, int n_members) {
        auto [begin, end] = split_range(w.rows, member, n_members);
        if (begin < end) widen_rows(w, begin, end, small.whole + begin * w.dim);
      });
      return dot_rows(x, n, ldx, small.whole, w.rows, w.dim, out, ldo);
    }
    const int64_t rows_per_tile = SmallMatrixScratch::tile_rows(w.dim);
    team.run([&](int member, int n_members) {
      auto [begin, end] = split_range(w.rows, member, n_members);
      if (w.dtype == Dtype::f8_e4m3) {  // widened in registers
        if (begin < end)
          dot_rows_fp8(x, n, ldx, w.codes.get() + begin * w.dim, w.factors.get(), begin, end - begin, w.dim,
                       out + begin, ldo);
        return;
      }
      float* tile = small.tiles + member * small.tile_floats;
      for (int64_t r = begin; r < end; r += rows_per_tile) {
        const int64_t last = std::min(end, r + rows_per_tile);
        widen_rows(w, r, last, tile);
        dot_rows_f32(x, n, ldx, tile, last - r, w.dim, out + r, ldo);
      }
    });
  }

  // y (+)= x @ W^T on every member, timed as `op`; decode-sized products share out their last
  // quarter as the members go (matmul_pool).
  void gemm(Op op, const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
            int64_t ldy, bool accumulate) {
    profiler.time(op, 2.0 * double(m) * double(w.n) * double(w.k), double(w.bytes), [&] {
      matmul_pool.store(0, std::memory_order_relaxed);  // run() publishes it to the members
      team.run([&](int member, int n) {
        matmul(x, m, ldx, w, y, ldy, accumulate, member, n, &matmul_pool);
      });
    });
  }

  ThreadTeam& team;
  OpProfiler profiler;
  SmallMatrixScratch small;
  std::atomic<uint64_t> expert_bytes_read{0};  // by the MoE layers of this pass
  alignas(64) std::atomic<int64_t> matmul_pool{0};  // its own cache line: both members add to it
};

// The rows one part of a pass works on.
struct PassRows {
  std::span<const BatchToken> tokens;  // [n]
  float* x;                            // [n][hidden]  their residual stream
  float* rope_cos;                     // [n][rotary_dim / 2]  each token's RoPE angles
  float* rope_sin;
  int64_t size() const { return int64_t(tokens.size()); }
};

// The normed rows every block takes as input, in FP32 (the router's) and BF16 (the products'),
// and the BF16 scratch each block's next product reads.
struct NormedRows {
  float* xn;  // [T][hidden]
  bf16* xb;   // [T][the widest input of any product]
};

// xn = rmsnorm(x) * weight; xb = bf16(xn)                           rows [0, n) of [n][H]
inline void rms_norm_to_bf16(BlockContext& ctx, const float* weight, float eps, const float* x,
                             int64_t n, int64_t H, NormedRows& out) {
  ctx.profiler.time(Op::norm, 0, 0, [&] {
    ctx.rows(n, [&](int64_t begin, int64_t end) {
      rmsnorm(x + begin * H, end - begin, H, H, weight, eps, out.xn + begin * H, H);
      convert_f32_to_bf16(out.xn + begin * H, out.xb + begin * H, (end - begin) * H);
    });
  });
}

// Carves buffers out of one virtual reservation: describe() names every buffer with its
// element count (each kAlign-aligned); it runs twice, once to size the reservation and once to
// hand out the pointers. Pages commit as a pass first touches them, so a plan for a long
// sequence costs address space, not RAM.
class ActivationPlan {
 public:
  template <class Describe>
  void build(Describe&& describe) {
    for (int pass = 0; pass < 2; ++pass) {
      offset_ = 0;
      describe(*this);
      if (pass == 0) {
        region_ = VirtualRegion(offset_ + kAlign);
        base_ = region_.data();
      }
    }
  }
  template <class T>
  void carve(T*& p, size_t count) {
    offset_ = (offset_ + kAlign - 1) / kAlign * kAlign;
    p = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;  // the sizing pass has no base
    offset_ += count * sizeof(T);
  }
  // Buffers of blocks that are never live at once share their memory: each part carves from
  // the same offset, and the plan goes on past the largest part.
  template <class... Parts>
  void overlay(Parts&&... parts) {
    const size_t start = offset_;
    size_t end = start;
    ((offset_ = start, parts(*this), end = std::max(end, offset_)), ...);
    offset_ = end;
  }

 private:
  VirtualRegion region_;
  uint8_t* base_ = nullptr;
  size_t offset_ = 0;
};

// The scratch for small matrices of up to `most_elements` elements and rows of up to `widest`.
inline void plan_small_matrix_scratch(ActivationPlan& plan, SmallMatrixScratch& s, size_t most_elements,
                                      int64_t widest, int members) {
  s.tile_floats = SmallMatrixScratch::kTileFloats + 4 * widest;
  plan.carve(s.whole, most_elements);
  plan.carve(s.tiles, size_t(members) * size_t(s.tile_floats));
}

}  // namespace ellm
