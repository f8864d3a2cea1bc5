#pragma once
// The table of kernels behind the entry points of kernels.h. Each instruction-set tier lives in
// its own folder (kernels/scalar, avx2, avx512, amx), compiled with that tier's flags, and exports
// one KernelTable; kernel_table() picks the table of a tier. A tier may leave entries null: they
// come from the tier below it (the AMX tier has its own matrix product and prefill attention block
// and runs the AVX-512 kernels for the rest). Nothing outside src/kernels includes this header,
// and the tier folders include only the headers of kernels/ itself, never each other's.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "base/cpu.h"
#include "kernels/kernels.h"

namespace ellm {

// The kernels' signatures (function types): a tier declares its own with them (e.g.
// `MatmulFn matmul;` in kernels/avx2/avx2.h) and the table holds pointers to them. The
// element-wise and matrix ones are the entry points of kernels.h.
using ConvertF32ToBf16Fn = void(const float* x, bf16* out, int64_t count);
using ConvertBf16ToF32Fn = void(const bf16* x, float* out, int64_t count);
using ConvertFp8ToF32Fn = void(const uint8_t* codes, float scale, float* out, int64_t count);
using ConvertF32ToF16Fn = void(const float* x, f16* out, int64_t count);
using RmsnormFn = void(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight,
                       float eps, float* out, int64_t ldo);
using NormRopeFn = void(const float* x, int64_t n_heads, int64_t head_dim, const float* weight,
                        float eps, const float* cos, const float* sin, float* out, int64_t ldo);
using RopePartialFn = void(float* x, int64_t n_heads, int64_t ldx, int64_t rotary_dim,
                           const float* cos, const float* sin);
using SiluMulFn = void(const float* gate, const float* up, float* out, int64_t count);
using SoftmaxExpFn = float(float* x, int64_t count, float scale);
using GeluTanhFn = void(const float* x, float* out, int64_t count);
// out[t][r] = x[t] . w[r] (x: [m][dim] at stride ldx, w: [rows][dim], out at stride ldo), FP32 in
// one order on every tier: input i goes into lane i % kDotLanes by FMA, then the lanes are summed
// as a tree (finish_dot_lanes).
using DotRowsF32Fn = void(const float* x, int64_t m, int64_t ldx, const float* w, int64_t rows,
                          int64_t dim, float* out, int64_t ldo);
// The same over E4M3 codes (no NaN) whose weight is code x the factor of its 128 x 128 block:
// codes of rows [row0, row0 + rows) of a matrix of `dim` columns, factors the whole matrix's
// [ceil(all rows / 128)][ceil(dim / 128)]. Each weight is widened with the one rounding of
// convert_fp8_e4m3_to_f32, so a product gives dot_rows_f32's bits over the widened matrix.
using DotRowsFp8Fn = void(const float* x, int64_t m, int64_t ldx, const uint8_t* codes,
                          const float* factors, int64_t row0, int64_t rows, int64_t dim, float* out,
                          int64_t ldo);
using Conv1dSiluFn = void(const float* x, int64_t n, int64_t ldx, float* window,
                          const float* weight, int64_t taps, int64_t channels, int64_t ld,
                          float* out, int64_t ldo);
using L2normFn = void(const float* x, int64_t rows, int64_t dim, int64_t ldx, float scale,
                      float eps, float* out, int64_t ldo);
using GatedRmsnormFn = void(const float* x, const float* z, int64_t rows, int64_t dim,
                            int64_t ldx, int64_t ldz, const float* weight, float eps, float* out,
                            int64_t ldo);
using GatedDeltaStepFn = void(float* S, int64_t dk, int64_t dv, const float* q, const float* k,
                              const float* v, float decay, float beta, float* out);
using GatedDeltaChunkFn = void(float* S, int64_t dk, int64_t dv, const float* q, const float* k,
                               int64_t ldqk, const float* v, int64_t ldv, const float* g,
                               const float* beta, int64_t ldg, int64_t n, float* out,
                               int64_t ldo, float* scratch);
// gated_delta_chunk's scratch (gated_delta_chunk_scratch_floats floats), C = kDeltaChunk.
struct DeltaChunkScratch {
  float* gamma;  // [C]      running sum of g, then exp(gamma_last - gamma)
  float* K;      // [C][dk]
  float* Q;      // [C][dk]
  float* KT;     // [dk][C]  zero beyond the chunk's tokens
  float* G;      // [C][C]   K K^T, then A = strict_lower(beta_t K K^T exp(gamma_t - gamma_s))
  float* P;      // [C][C]   Q K^T, then lower(Q K^T exp(gamma_t - gamma_s))
  float* T;      // [C][C]   (I + A)^-1
  float* B1;     // [C][dv]  diag(beta) V
  float* B2;     // [C][dk]  diag(beta exp(gamma)) K
  float* U;      // [C][dv]  T B1, then V' = U - W S
  float* W;      // [C][dk]  T B2
  DeltaChunkScratch(float* s, int64_t dk, int64_t dv) {
    const int64_t C = kDeltaChunk;
    auto take = [&s](int64_t floats) { return std::exchange(s, s + floats); };
    gamma = take(C), K = take(C * dk), Q = take(C * dk), KT = take(dk * C);
    G = take(C * C), P = take(C * C), T = take(C * C);
    B1 = take(C * dv), B2 = take(C * dk), U = take(C * dv), W = take(C * dk);
  }
};

// out.data in the tier's private layout (out.n, k and isa are already set).
using PackWeightsFn = void(const bf16* w, int64_t n, int64_t k, PackedWeights& out);
using MatmulFn = void(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
                      int64_t ldy, bool accumulate, int member, int n_members,
                      std::atomic<int64_t>* pool);
// Prefill on FP8 weights goes a panel of columns at a time, each converted once to a BF16
// layout: 128 columns (one factor row), or down to kFp8Cols when that leaves a member without 2.
inline int64_t fp8_panel_width(int64_t n, int n_members) {
  int64_t width = kFp8BlockK;
  while (width > kFp8Cols && (n + width - 1) / width < 2 * n_members) width /= 2;
  return width;
}

// A buffer of at least `bytes` private to the calling thread, one per `slot` (0 or 1); it grows
// when a larger one is asked for (the first passes) and is reused after (dispatch.cc).
void* thread_scratch(int slot, size_t bytes);

// One flash-attention step for `rows` query rows of one KV head against positions [p0, p1).
// Row r is query r / group, head r % group of the group: q + (r / group) * ldq + (r % group) *
// head_dim. It may see positions < first_end + r / group (causal). k, v point at position 0 of
// the head in the cache (elements of the table entry's KV dtype, kv_dtype.h); position p is at
// k + p * ldkv elements. FP8, int8: k_factors, v_factors point at the head's factor of position 0,
// the factor of position p ldkv bytes further on (null for FP16 and BF16); a score is
// (q . codes) * factor * scale, and a probability p weighs a V row as (p * factor) . codes.
// Online-softmax state per row: running max m[r], sum l[r], unnormalised output acc[r][head_dim].
// Any p1 - p0 (the driver passes 128 positions at a time, or a whole range for a one-head item);
// s is scratch of attention_scratch_floats.
using AttentionBlockFn = void(const float* q, int64_t ldq, int64_t group, int64_t rows,
                              int64_t first_end, const void* k, const void* v,
                              const float* k_factors, const float* v_factors, int64_t ldkv,
                              int64_t p0, int64_t p1, int64_t head_dim, float scale, float* m,
                              float* l, float* acc, float* s);

// attention_block for every KV head at once, for a few query rows (decode): q, m, l and acc are
// head-major ([n_kv_heads][rows], the head's q at q + h * group * head_dim), k and v point at
// position 0 of head 0 (FP8, int8: k_factors, v_factors at head 0's factor; head h's h floats on).
// Any p1 - p0. Reads each position's K and V row once, front to back.
// Only for the (head_dim, rows) its table's all_heads_supports accepts.
using AllHeadsFn = void(const float* q, int64_t ldq, int64_t n_kv_heads, int64_t group,
                        int64_t rows, int64_t first_end, const void* k, const void* v,
                        const float* k_factors, const float* v_factors, int64_t ldkv,
                        int64_t p0, int64_t p1, int64_t head_dim, float scale, float* m, float* l,
                        float* acc, float* s);

// The scratch of the scalar, AVX2 and AVX-512 attention blocks for up to `rows` rows.
inline size_t default_attention_scratch_floats(int64_t rows, int64_t head_dim) {
  return size_t(4 * ((rows > 64 ? rows : 64) + head_dim) * 64 + 16);
}

// The decode shapes the vector tiers' all-heads kernels are built for: head_dim 64, 128 or 256
// and 1, 2, 4 or 8 query rows per KV head (every Qwen3 decode shape; Qwen3.5+ with 2, 4 or 8
// query heads per KV head). The scalar one would take any, but takes these too, so every tier
// splits a pass into the same work.
inline bool qwen3_decode_shapes(int64_t head_dim, int64_t rows) {
  return (head_dim == 64 || head_dim == 128 || head_dim == 256) &&
         (rows == 1 || rows == 2 || rows == 4 || rows == 8);
}

// dot_rows_f32's order, shared by every tier: the lanes hold the FMA sums of inputs [0, from)
// (from a multiple of kDotLanes); the inputs [from, dim) go in by scalar FMA, lane i % kDotLanes,
// then the lanes fold in halves (l + 8, + 4, + 2, + 1).
constexpr int64_t kDotLanes = 16;
// The vector tiers walk the inputs in blocks of this many (an FP8 matrix's block of factors).
constexpr int64_t kDotBlock = 128;
static_assert(kDotBlock % kDotLanes == 0);
inline float fold_dot_lanes(float* lanes) {
  for (int64_t half = kDotLanes / 2; half > 0; half /= 2)
    for (int64_t l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  return lanes[0];
}
inline float finish_dot_lanes(float* lanes, const float* x, const float* w, int64_t from, int64_t dim) {
  for (int64_t i = from; i < dim; ++i) lanes[i % kDotLanes] = __builtin_fmaf(x[i], w[i], lanes[i % kDotLanes]);
  return fold_dot_lanes(lanes);
}
// The same over a row of E4M3 codes (dot_rows_fp8): row_factors, its 128-wide blocks' factors.
inline float finish_dot_lanes_fp8(float* lanes, const float* x, const uint8_t* codes, const float* row_factors,
                                  int64_t from, int64_t dim) {
  for (int64_t i = from; i < dim; ++i) {
    const float w = fp8_e4m3_to_f32(codes[i]) * row_factors[i / kFp8BlockK];
    lanes[i % kDotLanes] = __builtin_fmaf(x[i], w, lanes[i % kDotLanes]);
  }
  return fold_dot_lanes(lanes);
}

// A tier's attention block on BF16 products over an FP16 cache (kernels/bf16_attention.h), for a
// shape that asks for it (AttentionShape::bf16_products): tiles of kBf16AttentionTileRows rows
// (its acc must have room for rows rounded up to 16), a scratch of scratch_floats(head_dim) that
// keeps the blocks it packed for the rest of the pass, forgotten by forget_scratch. block is null
// where the tier has none.
constexpr int64_t kBf16AttentionTileRows = 256;
struct Bf16AttentionKernels {
  AttentionBlockFn* block;
  size_t (*scratch_floats)(int64_t head_dim);
  void (*forget_scratch)(float* s);
};

struct KernelTable {
  ConvertF32ToBf16Fn* convert_f32_to_bf16;
  ConvertBf16ToF32Fn* convert_bf16_to_f32;
  ConvertFp8ToF32Fn* convert_fp8_e4m3_to_f32;
  ConvertF32ToF16Fn* convert_f32_to_f16;
  RmsnormFn* rmsnorm;
  NormRopeFn* norm_rope;
  RopePartialFn* rope_partial;
  SiluMulFn* silu_mul;
  SoftmaxExpFn* softmax_exp;
  GeluTanhFn* gelu_tanh;
  DotRowsF32Fn* dot_rows_f32;
  DotRowsFp8Fn* dot_rows_fp8;
  Conv1dSiluFn* conv1d_silu;
  L2normFn* l2norm;
  GatedRmsnormFn* gated_rmsnorm;
  GatedDeltaStepFn* gated_delta_step;
  GatedDeltaChunkFn* gated_delta_chunk;
  PackWeightsFn* pack_weights;
  MatmulFn* matmul;
  // FP8 weights, any number of rows, each row with the same arithmetic whatever the count:
  // per 128 k a partial product of the codes' exact values, times the block's factor in FP32.
  MatmulFn* matmul_fp8;
  // INT4 weights, every m (kernels.h; null: the tier below's).
  MatmulFn* matmul_int4;
  // Attention: query rows (query x head) per prefill work item, and the block kernel with its
  // scratch size for up to `rows` rows (acc must have room for rows rounded up to 16).
  int64_t attention_tile_rows;
  // Attention over an FP16, BF16, FP8 and int8 cache (attention_block_for picks one).
  AttentionBlockFn* attention_block;
  AttentionBlockFn* attention_block_bf16;
  AttentionBlockFn* attention_block_fp8;
  AttentionBlockFn* attention_block_int8;
  size_t (*attention_scratch_floats)(int64_t rows, int64_t head_dim);
  // Forgets what a block kept in its scratch from an earlier call (null: it keeps nothing). The
  // driver calls it at the start of every pass and after any other kernel used the scratch.
  void (*forget_attention_scratch)(float* s);
  bool (*all_heads_supports)(int64_t head_dim, int64_t rows_per_head);
  AllHeadsFn* attention_block_all_heads;
  AllHeadsFn* attention_block_all_heads_bf16;
  AllHeadsFn* attention_block_all_heads_fp8;
  AllHeadsFn* attention_block_all_heads_int8;
  // Each tier's own (not inherited from the tier below).
  Bf16AttentionKernels attention_bf16_products;

  AttentionBlockFn* attention_block_for(KvDtype d) const {
    return d == KvDtype::f16    ? attention_block
           : d == KvDtype::bf16 ? attention_block_bf16
           : d == KvDtype::fp8  ? attention_block_fp8
                                : attention_block_int8;
  }
  AllHeadsFn* all_heads_for(KvDtype d) const {
    return d == KvDtype::f16    ? attention_block_all_heads
           : d == KvDtype::bf16 ? attention_block_all_heads_bf16
           : d == KvDtype::fp8  ? attention_block_all_heads_fp8
                                : attention_block_all_heads_int8;
  }
};

extern const KernelTable scalar_kernels;  // kernels/scalar/table.cc
extern const KernelTable avx2_kernels;    // kernels/avx2/table.cc
extern const KernelTable avx512_kernels;  // kernels/avx512/table.cc
extern const KernelTable amx_kernels;     // kernels/amx/table.cc

// The tier's table with its null entries filled from the tiers below (dispatch.cc).
const KernelTable& kernel_table(Isa isa);

}  // namespace ellm
