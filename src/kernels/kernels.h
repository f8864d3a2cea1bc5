#pragma once
// Kernel API used by the model layer. Every kernel is a free function on raw pointers and
// strides; each has a scalar twin (kernels/scalar/) that tests compare against. The
// instruction set is chosen at run time from base/cpu.h active_isa() unless a call passes one.
//
// Threading: kernels that take (member, n_members) do their own share of the work when called
// from every member of a ThreadTeam::run (base/threads.h) and never synchronise internally.
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "base/cpu.h"
#include "base/memory.h"
#include "kernels/kv_dtype.h"

namespace ellm {

using bf16 = uint16_t;

inline float bf16_to_f32(bf16 v) {
  uint32_t bits = uint32_t(v) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

inline bf16 f32_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t bits;
  __builtin_memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1);
  return bf16(bits >> 16);
}

// IEEE half precision: the KV cache's element type.
using f16 = uint16_t;

inline float f16_to_f32(f16 h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // infinity, NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);  // rebias 15 -> 127
  } else {
    float f = float(mantissa) * 0x1p-24f;  // zero, subnormal
    return sign ? -f : f;
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, saturating: a finite value or infinity beyond +-65504 becomes +-65504
// (an infinity in the cache would poison every later attention score). NaN stays NaN.
inline f16 f32_to_f16(float f) {
  uint32_t bits;
  __builtin_memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000u, magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return f16(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  if (magnitude >= 0x477fe000u) return f16(sign | 0x7bffu);  // >= 65504
  if (magnitude < 0x38800000u) {  // below 2^-14: a multiple of 2^-24 (or zero)
    float scaled = __builtin_fabsf(f) * 0x1p24f;  // exact
    return f16(sign | uint32_t(__builtin_nearbyintf(scaled)));
  }
  uint32_t rebiased = magnitude - (112u << 23);
  rebiased += 0xfffu + ((rebiased >> 13) & 1u);
  return f16(sign | (rebiased >> 13));
}

// FP8 E4M3 ("E4M3FN", as Qwen's FP8 checkpoints store weights): sign, 4 exponent bits (bias 7), 3
// mantissa bits; no infinities; 0x7F and 0xFF are NaN; the largest value is 448; exponent 0 holds
// the subnormals m / 8 * 2^-6.
inline float fp8_e4m3_to_f32(uint8_t code) {
  uint32_t sign = uint32_t(code & 0x80u) << 24, exponent = (code >> 3) & 0xfu, mantissa = code & 7u;
  if (exponent == 0xf && mantissa == 7) return __builtin_nanf("");
  uint32_t bits;
  if (exponent != 0) {
    bits = sign | ((exponent + 120) << 23) | (mantissa << 20);  // rebias 7 -> 127
  } else {
    float f = float(mantissa) * 0x1p-9f;  // zero, subnormal
    return sign ? -f : f;
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, saturating at +-448 (what a block scale of amax / 448 never exceeds but
// for rounding); NaN becomes 0x7F.
inline uint8_t f32_to_fp8_e4m3(float f) {
  uint32_t bits;
  __builtin_memcpy(&bits, &f, 4);
  uint8_t sign = uint8_t((bits >> 24) & 0x80u);
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return 0x7f;
  if (magnitude >= 0x43e00000u) return sign | 0x7e;  // >= 448
  if (magnitude < 0x3c800000u) {  // below 2^-6: a multiple of 2^-9 (code 8 is 2^-6, seamlessly)
    float scaled = __builtin_fabsf(f) * 512.0f;  // exact
    return sign | uint8_t(__builtin_nearbyintf(scaled));
  }
  magnitude += 0x7ffffu + ((magnitude >> 20) & 1u);  // round the mantissa to 3 bits
  uint32_t code = (magnitude >> 20) - (120u << 3);   // rebias 127 -> 7
  return sign | uint8_t(code > 0x7e ? 0x7e : code);
}

// ---- element-wise and row ops (FP32) ----

void convert_f32_to_bf16(const float* x, bf16* out, int64_t count);
void convert_bf16_to_f32(const bf16* x, float* out, int64_t count);
// out[i] = fp8_e4m3_to_f32(codes[i]) * scale (a NaN code gives NaN): the same bits on every tier.
void convert_fp8_e4m3_to_f32(const uint8_t* codes, float scale, float* out, int64_t count);
void convert_f32_to_f16(const float* x, f16* out, int64_t count);  // f32_to_f16 element-wise

// out[r][:] = x[r][:] / rms(x[r][:]) * weight[:], for r < rows; rows are `dim` long with strides
// ldx / ldo (may alias: out == x).
void rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight, float eps,
             float* out, int64_t ldo);

// The angles of rotate-half RoPE (HF Qwen3) at position pos: cos[i] = scale * cos(pos * inv_freq[i]),
// sin[i] likewise, i < half = head_dim / 2; inv_freq[i] = theta^(-2i/head_dim) (or YaRN's), scale
// YaRN's attention factor (1 without). The same libm code on every tier; a pass computes them
// once per token for all layers.
void rope_angles(int64_t pos, const float* inv_freq, int64_t half, float scale, float* cos, float* sin);
// Multimodal RoPE: the same with frequency i turning at position thw[axis[i]] (axis 0, 1, 2: T,
// H, W); equal positions give rope_angles' bits.
void rope_angles_thw(const int32_t* thw, const uint8_t* axis, const float* inv_freq, int64_t half,
                     float scale, float* cos, float* sin);

// Qwen3's per-head q/k norm then RoPE: out[h] = rope(rmsnorm(x[h]) * weight) for h < n_heads.
// x rows are head_dim long at stride head_dim; out rows at stride ldo (out may equal x, or point
// straight into the KV cache). cos/sin come from rope_angles at the token's position.
void norm_rope(const float* x, int64_t n_heads, int64_t head_dim, const float* weight, float eps,
               const float* cos, const float* sin, float* out, int64_t ldo);

// Rotate-half RoPE on the first rotary_dim dims of each head, in place (Qwen3.5's partial
// RoPE: pairs (d, d + rotary_dim / 2); the other dims pass through). Heads at stride ldx.
void rope_partial(float* x, int64_t n_heads, int64_t ldx, int64_t rotary_dim, const float* cos,
                  const float* sin);

// out[i] = silu(gate[i]) * up[i]
void silu_mul(const float* gate, const float* up, float* out, int64_t count);

// A softmax's weights before the division: x[i] = exp((x[i] - max(x)) * scale) in place, for
// i < count (count > 0); returns their sum. The SIMD tiers' e^x is the attention's (~2 ulp).
float softmax_exp(float* x, int64_t count, float scale);

// out[i] = gelu_pytorch_tanh(x[i]) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (may alias);
// the SIMD tiers as x / (1 + e^(-2 sqrt(2 / pi) (x + 0.044715 x^3))), the same function.
void gelu_tanh(const float* x, float* out, int64_t count);

// out[t][r] = x[t] . w[r] for t < m, r < rows (x: [m][dim] at stride ldx, w: [rows][dim], out
// at stride ldo), FP32: the same bits on every tier and for any m (a small product kept in FP32,
// such as a MoE router).
void dot_rows_f32(const float* x, int64_t m, int64_t ldx, const float* w, int64_t rows, int64_t dim,
                  float* out, int64_t ldo);
// The same over rows [row0, row0 + rows) of an FP8 checkpoint's matrix of `dim` columns, kept as
// E4M3 codes (no NaN; `codes` at row row0) with one factor per 128 x 128 block (`factors`, the
// whole matrix's): the bits of dot_rows_f32 over the matrix widened as convert_fp8_e4m3_to_f32
// widens it.
void dot_rows_fp8(const float* x, int64_t m, int64_t ldx, const uint8_t* codes, const float* factors,
                  int64_t row0, int64_t rows, int64_t dim, float* out, int64_t ldo);

// ---- Gated DeltaNet (Qwen3.5 linear attention), all FP32 ----

constexpr int64_t kMaxConvTaps = 8;          // the longest causal convolution conv1d_silu takes
constexpr int64_t kMaxDeltaHeadDim = 256;    // the widest value head gated_delta_step takes
constexpr int64_t kDeltaChunk = 64;          // tokens per chunk of gated_delta_chunk

// Causal depthwise convolution and SiLU over n consecutive tokens of one sequence, `channels`
// channels: out[t][c] = silu(sum_j weight[j][c] * in(t - taps + 1 + j)[c]), where in(t) is
// x[t] for t >= 0 and the window's rows before that. window [taps - 1][ld] holds the last
// taps - 1 inputs (oldest first) and is updated to those after token n - 1; weight [taps][ld]
// (tap taps - 1 multiplies the current token). Rows of x and out at strides ldx and ldo.
void conv1d_silu(const float* x, int64_t n, int64_t ldx, float* window, const float* weight,
                 int64_t taps, int64_t channels, int64_t ld, float* out, int64_t ldo);

// out[r][:] = x[r][:] / sqrt(sum(x[r]^2) + eps) * scale, for r < rows (may alias).
void l2norm(const float* x, int64_t rows, int64_t dim, int64_t ldx, float scale, float eps,
            float* out, int64_t ldo);

// The GDN output norm: out[r][:] = weight * x[r] / rms(x[r]) * silu(z[r]), for r < rows (the
// weight as stored, no +1).
void gated_rmsnorm(const float* x, const float* z, int64_t rows, int64_t dim, int64_t ldx,
                   int64_t ldz, const float* weight, float eps, float* out, int64_t ldo);

// One token of the gated delta rule on one value head's state S [dk][dv]:
//   S = decay * S;  e = v - S^T k;  S += k (beta e)^T;  out = S^T q.   dv <= kMaxDeltaHeadDim.
void gated_delta_step(float* S, int64_t dk, int64_t dv, const float* q, const float* k,
                      const float* v, float decay, float beta, float* out);

// The same for n <= kDeltaChunk consecutive tokens at once, in the chunked (WY) form, as
// matrix products: with gamma the running sum of the log-decays g, A = strict_lower(diag(beta)
// K K^T * exp(gamma_t - gamma_s)), T = (I + A)^-1 (forward substitution over the C x C matrix),
// U = T diag(beta) V, W = T diag(beta exp(gamma)) K, V' = U - W S:
//   out = (Q exp(gamma)) S + ((Q K^T) * exp(gamma_t - gamma_s), s <= t) V'
//   S   = exp(gamma_last) S + (K exp(gamma_last - gamma))^T V'
// Token t's q and k at q + t ldqk and k + t ldqk, v at v + t ldv, g and beta at t ldg, out at
// out + t ldo. scratch: gated_delta_chunk_scratch_floats(dk, dv).
void gated_delta_chunk(float* S, int64_t dk, int64_t dv, const float* q, const float* k,
                       int64_t ldqk, const float* v, int64_t ldv, const float* g,
                       const float* beta, int64_t ldg, int64_t n, float* out, int64_t ldo,
                       float* scratch);
inline size_t gated_delta_chunk_scratch_floats(int64_t dk, int64_t dv) {
  const int64_t C = kDeltaChunk;
  return size_t(C + 3 * C * C + 5 * C * dk + 2 * C * dv);
}

// ---- matrix products: weights BF16, inputs BF16, accumulation FP32 ----

// A weight matrix W [n][k] (checkpoint layout: out features x in features), repacked once at
// load for one instruction set. BF16: the layout of `data` is private to that ISA's kernels.
// FP8 (fp8 == true): `codes` and `scales` instead, in one layout for every tier:
//   codes[(b * k + kk) * 32 + c] = E4M3 code of W[b * 32 + c][kk]       (missing columns 0)
//   scales[b * k_blocks + kb]    = the factor of columns [32 b, 32 b + 32) x k in [128 kb, 128 kb + 128)
// W[j][kk] = fp8_e4m3_to_f32(code) * scale. A 32-column block always lies inside one 128-row
// block of the checkpoint's scales, so each block has one factor per 128 k.
constexpr int64_t kFp8Cols = 32, kFp8BlockK = 128;

// INT4 (int4 == true): 4-bit codes q with a factor and a zero point per output column and group
// of `group` inputs (group divides k and is a multiple of 4), in one layout for every tier,
// columns in blocks of 32 and inputs in quads (4 consecutive inputs), a quad of a block in 64
// bytes, each column's 4 codes in 4 consecutive bytes:
//   codes[(b * k + 4 * (kk / 4)) * 16 + 4 * (c % 16) + kk % 4] = q of W[b * 32 + c][kk], column
//                                       c < 16 in the low nibble, c + 16 in the high one (missing columns 0)
//   scales[(b * groups + g) * 32 + c], zeros[...] likewise: column b * 32 + c, inputs of group g
// So a 32-bit lane of a quad holds one column's 4 inputs, as vpdpbusd multiplies them, and a
// shift and a mask give one input of 16 columns. W[j][kk] = scale * (q - zero), q in [0, 15],
// zero in [0, 16] (16: a GPTQ v1 file's stored 15). With `k_order` (GPTQ act-order), packed
// input kk is input k_order[kk] of x: the loader sorted the inputs by group.
constexpr int64_t kInt4Cols = 32;
// Inputs per int8 factor when x is quantised for an INT4 product (w.int8_inputs): 32, or the
// largest divisor of the group below it that keeps whole quads.
constexpr int64_t kInt8Block = 32;
inline int64_t int8_block(int64_t group) {
  int64_t block = kInt8Block;
  while (group % block) block -= 4;
  return block;
}

struct PackedWeights {
  int64_t n = 0, k = 0;
  Isa isa = Isa::scalar;
  Buffer<bf16> data;
  size_t bytes = 0;  // bytes of packed data (what one full read of W costs)
  bool fp8 = false;
  Buffer<uint8_t> codes;
  Buffer<float> scales;
  int64_t k_blocks = 0;  // ceil(k / 128)
  bool int4 = false;
  int64_t group = 0, groups = 0;  // INT4: inputs per factor, k / group
  Buffer<uint8_t> zeros;
  Buffer<int32_t> k_order;  // INT4: empty when the inputs are in order
  bool int8_inputs = false;  // INT4: products quantise x to int8 (see matmul); set at load
};

PackedWeights pack_weights(const bf16* w, int64_t n, int64_t k, Isa isa);

// An empty FP8 matrix of n x k for isa, codes and scales zeroed, to be filled in the layout above
// (fp8_code_index and fp8_scale_index), e.g. by the loader straight from a checkpoint.
PackedWeights make_fp8_weights(int64_t n, int64_t k, Isa isa);
// The same from a checkpoint's codes [n][k] and factors [ceil(n / 128)][ceil(k / 128)].
PackedWeights pack_fp8_weights(const uint8_t* codes, const float* block_scales, int64_t n,
                               int64_t k, Isa isa);
inline size_t fp8_code_index(const PackedWeights& w, int64_t j, int64_t kk) {
  return size_t(((j / kFp8Cols) * w.k + kk) * kFp8Cols + j % kFp8Cols);
}
inline size_t fp8_scale_index(const PackedWeights& w, int64_t j, int64_t kb) {
  return size_t((j / kFp8Cols) * w.k_blocks + kb);
}

// An empty INT4 matrix of n x k in groups of `group` inputs (codes, factors and zeros zeroed),
// to be filled through the helpers below, e.g. by the loader straight from a GPTQ/AWQ checkpoint.
PackedWeights make_int4_weights(int64_t n, int64_t k, int64_t group, Isa isa);
// The same from codes [n][k] (one per byte), factors and zeros [n][k / group].
PackedWeights pack_int4_weights(const uint8_t* codes, const float* scales, const uint8_t* zeros,
                                int64_t n, int64_t k, int64_t group, Isa isa);
inline size_t int4_code_byte(const PackedWeights& w, int64_t j, int64_t kk) {
  return size_t(((j / kInt4Cols) * w.k + kk / 4 * 4) * 16 + j % 16 * 4 + kk % 4);
}
inline int int4_code_shift(int64_t j) { return j % kInt4Cols < 16 ? 0 : 4; }
inline void set_int4_code(PackedWeights& w, int64_t j, int64_t kk, uint8_t q) {
  uint8_t& byte = w.codes[int4_code_byte(w, j, kk)];
  const int shift = int4_code_shift(j);
  byte = uint8_t((byte & ~(15 << shift)) | ((q & 15) << shift));
}
inline uint8_t int4_code(const PackedWeights& w, int64_t j, int64_t kk) {
  return (w.codes[int4_code_byte(w, j, kk)] >> int4_code_shift(j)) & 15;
}
inline size_t int4_group_index(const PackedWeights& w, int64_t j, int64_t g) {  // scales, zeros
  return size_t(((j / kInt4Cols) * w.groups + g) * kInt4Cols + j % kInt4Cols);
}

// y[i][j] = sum_k x[i][k] * W[j][k]  (or += when accumulate), i < m, j < W.n.
// x: [m][k] BF16, row stride ldx; y: [m][n] FP32, row stride ldy. The member computes its share
// of the output; all members together cover y. With a `pool` (zeroed before the members start),
// the members share the last quarter out as they go (share_work): on the AVX2 and AVX-512 tiers
// for decode-sized products (a few rows) only, larger ones split evenly; the scalar twin always.
//
// FP8 weights: decode-sized products (a few rows) stream the codes and widen them in registers,
// applying each block's factor once per 128 k of every dot product; larger ones convert each
// member's weights, a panel of columns at a time, to the tier's packed BF16 layout once per call
// and run the BF16 product on it over the codes' exact values, each 128 k's result from zero
// times its factor as decode does, so a row's result is the same bits in any pass, on every tier
// (AVX2: FP32 FMA chains; AVX-512: vdpbf16ps; AMX: the AVX-512 FP8 product). The scalar twin
// computes every row the decode way.
//
// INT4 weights, x as BF16 (w.int8_inputs false): per row, column and group, one FMA chain in k
// order from zero over x (BF16, gathered by k_order) times q - zero (exact small integers), then
// y = partial * factor + y: every product is exact, so every tier gives the same bits, in any
// pass. Every tier widens the codes in registers, for a few rows (decode) and for tiles of rows
// alike, so a row's arithmetic never depends on the rows beside it.
//
// INT4 weights, x quantised to int8 (w.int8_inputs true; --activations int8): each row of x (in
// the weights' input order) is cut into blocks of int8_block(group) inputs (32, or fewer when a
// group is not a multiple of 32), each with its own factor: d = amax / 127, xq = round(x * (127
// / amax)) (round to nearest even; all zero: d = 0, xq = 0), and s = the sum of its xq. Then per
// row, column and group: partial = 0; for each block, partial = fma(float(sum of xq * q - zero *
// s), d, partial) (the sum exact in int32: vpdpbusd, or its AVX2 emulation); y = partial * factor
// + y. Every step is exact or rounds the same way on every tier: the same bits everywhere, in any
// pass. It is another numeric path than the BF16 one (the goldens' tolerance does not cover it).
void matmul(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y, int64_t ldy,
            bool accumulate, int member, int n_members, std::atomic<int64_t>* pool = nullptr);

// ---- attention ----

// One sequence's queries in a pass: positions [q_start, q_start + n_q) of its slot. Each query
// attends causally to cache positions [0, its position]. The cache of the slot holds K and V as
// rows of shape.kv_dtype (kv_dtype.h), kv_row_stride elements apart, already written for every
// position up to q_start + n_q - 1.
struct AttentionSeq {
  const float* q;  // [n_q][n_heads * head_dim], row stride ldq
  float* out;      // [n_q][n_heads * head_dim], row stride ldo
  int64_t n_q;
  int64_t q_start;
  const void* k;   // position 0, head 0
  const void* v;
};

struct AttentionShape {
  int64_t n_heads, n_kv_heads, head_dim;
  int64_t ldq, ldo;
  // Elements of kv_dtype (bytes for FP8) from one position to the next: head h starts at
  // h * head_dim; FP8's and int8's factors follow the n_kv_heads * head_dim codes (a multiple of
  // 4 bytes).
  int64_t kv_row_stride;
  float scale;  // 1/sqrt(head_dim)
  KvDtype kv_dtype = KvDtype::f16;
  // QK^T and P.V on BF16 products (Q, K, P and V rounded to BF16, FP32 sums) where the tier has
  // them (AVX-512-BF16, AMX) and the cache is FP16. Every row of such a pass, decode's included,
  // then goes through the tier's BF16 block kernel, so a row is the same bits in any pass.
  bool bf16_products = false;
  // The longest context a query attends: sizes the scratch for decode split along positions
  // (flash-decoding), which runs up to here; a longer one is split by KV heads only.
  int64_t max_positions = 131072;
};

// Scratch floats attention() needs for up to max_seqs sequences, max_tokens queries in a pass,
// with n_members members. The scratch must be zero-filled once when allocated (make_buffer does
// that); attention() leaves it reusable for the next call.
size_t attention_scratch_floats(const AttentionShape& shape, int64_t max_tokens, int64_t max_seqs,
                                int n_members);

// Causal GQA attention for all sequences of a pass, split across members: call it from every
// member of a ThreadTeam::run with the same arguments (flash attention, FP32 online softmax; each
// K/V block serves all query heads of its group). Prefill work is dealt out balanced over the
// causal triangle. When a pass has too few (sequence, KV head) items for the members (decode of
// few sequences with long contexts), a sequence's positions are also split across members
// (flash-decoding); the member that finishes last merges the partial results (an atomic counter
// in the scratch), so no second call or barrier is needed: out is complete when run() returns.
// Requires n_heads % n_kv_heads == 0.
void attention(const AttentionSeq* seqs, int64_t n_seqs, const AttentionShape& shape,
               float* scratch, int member, int n_members);
// Whether the active tier has attention on BF16 products (AttentionShape::bf16_products).
bool has_bf16_attention_products();

}  // namespace ellm
