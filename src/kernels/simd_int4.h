#pragma once
// The INT4 product's driver (layout and arithmetic in kernels.h), shared by the SIMD tiers: rows
// of x are prepared once per group of rows (as FP32, or quantised to int8 blocks), then each
// member runs its 32-column blocks of W over tiles of rows, every group of inputs through the
// tier's kernel, which widens the codes in registers. Decode and prefill are the same code with
// more or fewer rows in a tile, so a row's result never depends on its pass.
//
// A tier provides (as static members of Tier):
//   kDecodeRows         products of up to this many rows share out their last blocks (pool)
//   tile_rows(w)        rows per tile (at most kMaxTileRows), for w's kind of inputs
//   prepare(x, ldx, rows, w, in)       rows of x into `in` (FP32 or int8, as w.int8_inputs)
//   run(in, r0, rows, w, b, out)  out[rows][32] += rows [r0, r0 + rows) of in times the
//                       columns of block b, over every group
//
// One block at a time, also for a single row: a member's weights are then one stream front to
// back. Two blocks at once (more independent chains for one row) read two streams 16 KiB apart,
// and on AMD EPYC Zen 5 that held the lm_head's stream at 0.57-0.62 of the read probe on the
// AVX-512 and AVX2 tiers, against 0.86-1.0 one block at a time.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "base/threads.h"
#include "kernels/kernel_table.h"
#include "kernels/simd_elementwise.h"

namespace ellm::simd {

constexpr int kMaxTileRows = 12;

// Rows of x prepared for an INT4 product, inputs in the weights' order: FP32 (xf), or int8 codes
// (xq) with a factor (d) and the codes' sum (s) per int8_block(group) inputs.
struct Int4Rows {
  float* xf = nullptr;
  int8_t* xq = nullptr;
  float* d = nullptr;
  int32_t* s = nullptr;
  int64_t ld = 0;   // elements from one row to the next in xf and xq (k)
  int64_t ldb = 0;  // from one row to the next in d and s (blocks per row)
};

// The int8 quantisation of one block of len inputs (kernels.h): codes q, factor d = amax / 127
// and the codes' sum s. The reference every tier's vector version reproduces bit for bit.
inline void quantize_int8_block(const float* x, int64_t len, int8_t* q, float* d, int32_t* s) {
  float amax = 0;
  for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float inverse = amax > 0 ? 127.0f / amax : 0.0f;
  int32_t sum = 0;
  for (int64_t i = 0; i < len; ++i) {
    q[i] = int8_t(std::nearbyint(x[i] * inverse));
    sum += q[i];
  }
  *d = amax / 127.0f;
  *s = sum;
}

// Rows of x into `in` (kernels.h): as FP32 in the weights' input order and, for int8 inputs,
// quantised a block at a time, blocks of 32 by the tier's quantize_32 (bit for bit
// quantize_int8_block), others by quantize_int8_block itself.
template <class V, class Quantize32>
void int4_prepare(const bf16* x, int64_t ldx, int64_t rows, const PackedWeights& w, Int4Rows& in,
                  Quantize32&& quantize_32) {
  const int32_t* order = w.k_order.get();
  const int64_t k = w.k, A = int8_block(w.group);
  for (int64_t r = 0; r < rows; ++r) {
    const bf16* xr = x + r * ldx;
    float* xf = in.xf + r * in.ld;
    if (!order) {
      convert_bf16_to_f32<V>(xr, xf, k);
    } else {
      for (int64_t kk = 0; kk < k; ++kk) xf[kk] = bf16_to_f32(xr[order[kk]]);
    }
    if (!w.int8_inputs) continue;
    int8_t* q = in.xq + r * in.ld;
    float* d = in.d + r * in.ldb;
    int32_t* s = in.s + r * in.ldb;
    for (int64_t a = 0; a < k / A; ++a) {
      if (A == 32)
        quantize_32(xf + a * A, q + a * A, d + a, s + a);
      else
        quantize_int8_block(xf + a * A, A, q + a * A, d + a, s + a);
    }
  }
}

// One group of a block as the tiers' group kernels take it: where its codes, factors and zeros
// start, and its inputs.
struct Int4Group {
  const uint8_t* codes;
  const float* scales;
  const uint8_t* zeros;
  int64_t len;  // inputs (w.group)
  int64_t k0;   // the first one
  int64_t a0;   // the first int8 block (int8 inputs)
  int64_t A;    // inputs per int8 block
  Int4Group(const PackedWeights& w, int64_t b)
      : codes(w.codes.get() + b * w.k * 16),
        scales(w.scales.get() + b * w.groups * kInt4Cols),
        zeros(w.zeros.get() + b * w.groups * kInt4Cols),
        len(w.group),
        k0(0),
        a0(0),
        A(int8_block(w.group)) {}
  void next() {
    codes += len * 16;
    scales += kInt4Cols;
    zeros += kInt4Cols;
    k0 += len;
    a0 += len / A;
  }
};

// The tier's group kernel over every group of block b: fn(in, r0, group, out).
template <class Fn>
inline void for_each_group(const PackedWeights& w, int64_t b, Fn&& fn) {
  Int4Group at(w, b);
  for (int64_t g = 0; g < w.groups; ++g, at.next()) fn(at);
}

// Rows prepared at once: all of a decode product's, else enough for about 256 KiB of inputs
// (they stay in L2 while the member's blocks pass by), a multiple of the tile.
inline int64_t int4_group_rows(const PackedWeights& w, int64_t m, int64_t decode_rows,
                               int64_t tile_rows) {
  if (m <= decode_rows) return m;
  const int64_t row_bytes = w.int8_inputs ? w.k + 8 * w.k / int8_block(w.group) : 4 * w.k;
  const int64_t rows = std::max<int64_t>(1, (256 << 10) / row_bytes) / tile_rows * tile_rows;
  return std::min(m, std::max(rows, tile_rows));
}

// Points `in` at the calling thread's scratch, sized for `rows` rows.
inline void int4_scratch(const PackedWeights& w, int64_t rows, Int4Rows& in) {
  const int64_t blocks = w.k / int8_block(w.group);
  in.ld = w.k;
  in.ldb = blocks;
  const size_t floats = size_t(rows * w.k), codes = w.int8_inputs ? size_t(rows * w.k) : 0;
  const size_t factors = w.int8_inputs ? size_t(rows * blocks) : 0;
  uint8_t* p = static_cast<uint8_t*>(thread_scratch(
      0, (floats + 2 * factors) * 4 + (codes + 63) / 64 * 64 + 64));
  in.xf = reinterpret_cast<float*>(p);
  in.d = in.xf + floats;
  in.s = reinterpret_cast<int32_t*>(in.d + factors);
  in.xq = reinterpret_cast<int8_t*>(in.s + factors);
}

template <class Tier>
void matmul_int4(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
                 int64_t ldy, bool accumulate, int member, int n_members,
                 std::atomic<int64_t>* pool) {
  const int64_t blocks = (w.n + kInt4Cols - 1) / kInt4Cols, tile_rows = Tier::tile_rows(w);
  const int64_t group_rows = int4_group_rows(w, m, Tier::kDecodeRows, tile_rows);
  Int4Rows in;
  int4_scratch(w, group_rows, in);
  for (int64_t r0 = 0; r0 < m; r0 += group_rows) {
    const int64_t rows = std::min(group_rows, m - r0);
    Tier::prepare(x + r0 * ldx, ldx, rows, w, in);
    auto body = [&](int64_t b0, int64_t b1) {
      alignas(64) float out[kMaxTileRows * kInt4Cols];  // [row][32]
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t column = b * kInt4Cols, cols = std::min(kInt4Cols, w.n - column);
        for (int64_t t0 = 0; t0 < rows; t0 += tile_rows) {
          const int64_t tile = std::min(tile_rows, rows - t0);
          for (int64_t r = 0; r < tile; ++r) {
            float* o = out + r * kInt4Cols;
            const float* yr = y + (r0 + t0 + r) * ldy + column;
            for (int64_t c = 0; c < kInt4Cols; ++c) o[c] = accumulate && c < cols ? yr[c] : 0.0f;
          }
          Tier::run(in, t0, tile, w, b, out);
          for (int64_t r = 0; r < tile; ++r)
            std::copy_n(out + r * kInt4Cols, cols, y + (r0 + t0 + r) * ldy + column);
        }
      }
    };
    if (m <= Tier::kDecodeRows) {
      share_work(blocks, member, n_members, pool, body);
    } else {
      auto [b0, b1] = split_range(blocks, member, n_members);
      if (b0 < b1) body(b0, b1);
    }
  }
}

}  // namespace ellm::simd
