#pragma once
// Per-instruction-set implementations behind the entry points of kernels.h. Each namespace is
// compiled in its own files (*_scalar.cc baseline, *_avx2.cc, *_avx512.cc) with matching flags;
// dispatch.cc picks one at run time. Nothing outside src/kernels includes this header.
#include <cstdint>

#include "kernels/kernels.h"

namespace ellm {

// One flash-attention step for `rows` query rows of one KV head against positions [p0, p1).
// Row r is query r / group, head r % group of the group: q + (r / group) * ldq + (r % group) *
// head_dim. It may see positions < first_end + r / group (causal). k, v point at position 0 of
// the head; position p is at k + p * ldkv (FP16). Online-softmax state per row: running max m[r], sum l[r],
// unnormalised output acc[r][head_dim]. Any p1 - p0 (taken 64 positions at a time); s is
// scratch of 256 * (max(rows, 64) + head_dim) + 16 floats.
#define ELLM_ISA_KERNELS                                                                          \
  void convert_f32_to_bf16(const float* x, bf16* out, int64_t count);                             \
  void convert_bf16_to_f32(const bf16* x, float* out, int64_t count);                             \
  void convert_f32_to_f16(const float* x, f16* out, int64_t count);                               \
  void rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight,        \
               float eps, float* out, int64_t ldo);                                                \
  void norm_rope(const float* x, int64_t n_heads, int64_t head_dim, const float* weight,         \
                 float eps, const float* cos, const float* sin, float* out, int64_t ldo);         \
  void silu_mul(const float* gate, const float* up, float* out, int64_t count);                   \
  void pack_weights(const bf16* w, int64_t n, int64_t k, PackedWeights& out);                     \
  void matmul(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,             \
              int64_t ldy, bool accumulate, int member, int n_members,                            \
              std::atomic<int64_t>* pool);                                                        \
  void attention_block(const float* q, int64_t ldq, int64_t group, int64_t rows,                  \
                       int64_t first_end, const f16* k, const f16* v, int64_t ldkv,             \
                       int64_t p0, int64_t p1, int64_t head_dim, float scale, float* m, float* l, float* acc, float* s);

namespace scalar { ELLM_ISA_KERNELS }
namespace avx2 { ELLM_ISA_KERNELS }
namespace avx512 { ELLM_ISA_KERNELS }

#undef ELLM_ISA_KERNELS

// The AMX tier has its own matrix product (on the AVX-512 packed layout) and prefill attention
// block (rows <= 256, head_dim a multiple of 32 up to 256; other shapes go to AVX-512).
namespace amx {
void matmul(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y, int64_t ldy,
            bool accumulate, int member, int n_members, std::atomic<int64_t>* pool);
void attention_block(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
                     const f16* k, const f16* v, int64_t ldkv, int64_t p0, int64_t p1,
                     int64_t head_dim, float scale, float* m, float* l, float* acc, float* s);
// Its acc must have room for `rows` rounded up to 16: it reads those padding rows and writes them
// back unchanged. Its s is larger than the other tiers' (it keeps the blocks it packed for the
// rest of the pass):
// this many floats. clear_attention_cache(s) forgets them; the driver calls it at the start of
// every pass and after any other kernel used s.
size_t attention_block_scratch_floats(int64_t head_dim);
void clear_attention_cache(float* s);
}

// attention_block for every KV head at once, for a few query rows (decode): q, m, l and acc are
// head-major ([n_kv_heads][rows], the head's q at q + h * group * head_dim), k and v point at
// position 0 of head 0. Any p1 - p0; s is scratch of what attention_block needs (at least 256
// floats). Reads each position's K and V row once, front to back. The SIMD versions take
// head_dim 64 or 128 and rows 1, 2, 4 or 8 (every Qwen3 decode shape); the scalar one any.
#define ELLM_ALL_HEADS_KERNEL                                                                     \
  void attention_block_all_heads(const float* q, int64_t ldq, int64_t n_kv_heads, int64_t group,  \
                                 int64_t rows, int64_t first_end, const f16* k, const f16* v,   \
                                 int64_t ldkv, int64_t p0, int64_t p1, int64_t head_dim,          \
                                 float scale, float* m, float* l, float* acc, float* s);

namespace scalar { ELLM_ALL_HEADS_KERNEL }
namespace avx2 { ELLM_ALL_HEADS_KERNEL }
namespace avx512 { ELLM_ALL_HEADS_KERNEL }

#undef ELLM_ALL_HEADS_KERNEL

}  // namespace ellm
