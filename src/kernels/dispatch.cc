// Entry points of kernels.h: each calls the kernel table of the active tier (or, for a matrix
// product, of the tier its weights were packed for).
#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "base/error.h"
#include "base/threads.h"
#include "kernels/kernel_table.h"

namespace ellm {
namespace {

// Fills the entries of `table` that are null (0) from `below`.
template <class... Entries>
void inherit(KernelTable& table, const KernelTable& below, Entries... entries) {
  ((table.*entries = table.*entries ? table.*entries : below.*entries), ...);
}

std::array<KernelTable, 4> complete_tables() {
  std::array<KernelTable, 4> t{scalar_kernels, avx2_kernels, avx512_kernels, amx_kernels};
  // forget_attention_scratch stays each tier's own: null when its block keeps nothing.
  for (size_t i = 1; i < t.size(); ++i)
    inherit(t[i], t[i - 1], &KernelTable::convert_f32_to_bf16, &KernelTable::convert_bf16_to_f32,
            &KernelTable::convert_fp8_e4m3_to_f32,
            &KernelTable::convert_f32_to_f16, &KernelTable::rmsnorm, &KernelTable::norm_rope,
            &KernelTable::rope_partial, &KernelTable::silu_mul, &KernelTable::softmax_exp, &KernelTable::gelu_tanh,
            &KernelTable::dot_rows_f32, &KernelTable::dot_rows_fp8, &KernelTable::conv1d_silu, &KernelTable::l2norm,
            &KernelTable::gated_rmsnorm, &KernelTable::gated_delta_step,
            &KernelTable::gated_delta_chunk, &KernelTable::pack_weights, &KernelTable::matmul,
            &KernelTable::matmul_fp8, &KernelTable::matmul_int4,
            &KernelTable::attention_tile_rows, &KernelTable::attention_block,
            &KernelTable::attention_block_bf16, &KernelTable::attention_block_fp8,
            &KernelTable::attention_block_int8,
            &KernelTable::attention_scratch_floats, &KernelTable::all_heads_supports,
            &KernelTable::attention_block_all_heads, &KernelTable::attention_block_all_heads_bf16,
            &KernelTable::attention_block_all_heads_fp8, &KernelTable::attention_block_all_heads_int8);
  return t;
}

}  // namespace

const KernelTable& kernel_table(Isa isa) {
  static const std::array<KernelTable, 4> tables = complete_tables();
  return tables[size_t(isa)];
}

bool has_bf16_attention_products() {
  return kernel_table(active_isa()).attention_bf16_products.block != nullptr;
}

void convert_f32_to_bf16(const float* x, bf16* out, int64_t count) {
  kernel_table(active_isa()).convert_f32_to_bf16(x, out, count);
}

void convert_bf16_to_f32(const bf16* x, float* out, int64_t count) {
  kernel_table(active_isa()).convert_bf16_to_f32(x, out, count);
}

void convert_fp8_e4m3_to_f32(const uint8_t* codes, float scale, float* out, int64_t count) {
  kernel_table(active_isa()).convert_fp8_e4m3_to_f32(codes, scale, out, count);
}

void convert_f32_to_f16(const float* x, f16* out, int64_t count) {
  kernel_table(active_isa()).convert_f32_to_f16(x, out, count);
}

void rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight, float eps,
             float* out, int64_t ldo) {
  kernel_table(active_isa()).rmsnorm(x, rows, dim, ldx, weight, eps, out, ldo);
}

void rope_angles(int64_t pos, const float* inv_freq, int64_t half, float scale, float* cos, float* sin) {
  for (int64_t i = 0; i < half; ++i) {
    float angle = float(pos) * inv_freq[i];
    cos[i] = std::cos(angle) * scale;
    sin[i] = std::sin(angle) * scale;
  }
}

void rope_angles_thw(const int32_t* thw, const uint8_t* axis, const float* inv_freq, int64_t half,
                     float scale, float* cos, float* sin) {
  for (int64_t i = 0; i < half; ++i) {
    float angle = float(thw[axis[i]]) * inv_freq[i];
    cos[i] = std::cos(angle) * scale;
    sin[i] = std::sin(angle) * scale;
  }
}

void norm_rope(const float* x, int64_t n_heads, int64_t head_dim, const float* weight, float eps,
               const float* cos, const float* sin, float* out, int64_t ldo) {
  kernel_table(active_isa()).norm_rope(x, n_heads, head_dim, weight, eps, cos, sin, out, ldo);
}

void rope_partial(float* x, int64_t n_heads, int64_t ldx, int64_t rotary_dim, const float* cos,
                  const float* sin) {
  kernel_table(active_isa()).rope_partial(x, n_heads, ldx, rotary_dim, cos, sin);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t count) {
  kernel_table(active_isa()).silu_mul(gate, up, out, count);
}

float softmax_exp(float* x, int64_t count, float scale) {
  return kernel_table(active_isa()).softmax_exp(x, count, scale);
}

void gelu_tanh(const float* x, float* out, int64_t count) {
  kernel_table(active_isa()).gelu_tanh(x, out, count);
}

void dot_rows_fp8(const float* x, int64_t m, int64_t ldx, const uint8_t* codes, const float* factors,
                  int64_t row0, int64_t rows, int64_t dim, float* out, int64_t ldo) {
  kernel_table(active_isa()).dot_rows_fp8(x, m, ldx, codes, factors, row0, rows, dim, out, ldo);
}

void dot_rows_f32(const float* x, int64_t m, int64_t ldx, const float* w, int64_t rows, int64_t dim,
                  float* out, int64_t ldo) {
  kernel_table(active_isa()).dot_rows_f32(x, m, ldx, w, rows, dim, out, ldo);
}

void conv1d_silu(const float* x, int64_t n, int64_t ldx, float* window, const float* weight,
                 int64_t taps, int64_t channels, int64_t ld, float* out, int64_t ldo) {
  kernel_table(active_isa()).conv1d_silu(x, n, ldx, window, weight, taps, channels, ld, out, ldo);
}

void l2norm(const float* x, int64_t rows, int64_t dim, int64_t ldx, float scale, float eps,
            float* out, int64_t ldo) {
  kernel_table(active_isa()).l2norm(x, rows, dim, ldx, scale, eps, out, ldo);
}

void gated_rmsnorm(const float* x, const float* z, int64_t rows, int64_t dim, int64_t ldx,
                   int64_t ldz, const float* weight, float eps, float* out, int64_t ldo) {
  kernel_table(active_isa()).gated_rmsnorm(x, z, rows, dim, ldx, ldz, weight, eps, out, ldo);
}

void gated_delta_step(float* S, int64_t dk, int64_t dv, const float* q, const float* k,
                      const float* v, float decay, float beta, float* out) {
  kernel_table(active_isa()).gated_delta_step(S, dk, dv, q, k, v, decay, beta, out);
}

void gated_delta_chunk(float* S, int64_t dk, int64_t dv, const float* q, const float* k,
                       int64_t ldqk, const float* v, int64_t ldv, const float* g,
                       const float* beta, int64_t ldg, int64_t n, float* out, int64_t ldo,
                       float* scratch) {
  kernel_table(active_isa()).gated_delta_chunk(S, dk, dv, q, k, ldqk, v, ldv, g, beta, ldg, n,
                                               out, ldo, scratch);
}

PackedWeights pack_weights(const bf16* w, int64_t n, int64_t k, Isa isa) {
  if (n <= 0 || k <= 0)
    fail("pack_weights", "empty weight matrix " + std::to_string(n) + "x" + std::to_string(k));
  PackedWeights out;
  out.n = n;
  out.k = k;
  out.isa = isa;
  kernel_table(isa).pack_weights(w, n, k, out);
  return out;
}

PackedWeights make_fp8_weights(int64_t n, int64_t k, Isa isa) {
  if (n <= 0 || k <= 0)
    fail("pack_weights", "empty weight matrix " + std::to_string(n) + "x" + std::to_string(k));
  PackedWeights w;
  w.n = n;
  w.k = k;
  w.isa = isa;
  w.fp8 = true;
  w.k_blocks = (k + kFp8BlockK - 1) / kFp8BlockK;
  const int64_t blocks = (n + kFp8Cols - 1) / kFp8Cols;
  w.codes = make_buffer<uint8_t>(size_t(blocks * k * kFp8Cols));
  w.scales = make_buffer<float>(size_t(blocks * w.k_blocks));
  w.bytes = size_t(blocks * k * kFp8Cols) + size_t(blocks * w.k_blocks) * sizeof(float);
  return w;
}

PackedWeights pack_fp8_weights(const uint8_t* codes, const float* block_scales, int64_t n,
                               int64_t k, Isa isa) {
  PackedWeights w = make_fp8_weights(n, k, isa);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kk = 0; kk < k; ++kk) w.codes[fp8_code_index(w, j, kk)] = codes[j * k + kk];
    for (int64_t kb = 0; kb < w.k_blocks; ++kb)
      w.scales[fp8_scale_index(w, j, kb)] = block_scales[(j / kFp8BlockK) * w.k_blocks + kb];
  }
  return w;
}

PackedWeights make_int4_weights(int64_t n, int64_t k, int64_t group, Isa isa) {
  if (n <= 0 || k <= 0)
    fail("pack_weights", "empty weight matrix " + std::to_string(n) + "x" + std::to_string(k));
  if (group <= 0 || k % group || group % 4)
    fail("pack_weights", "INT4 group of " + std::to_string(group) + " inputs does not divide " +
                             std::to_string(k) + " or is not a multiple of 4");
  PackedWeights w;
  w.n = n;
  w.k = k;
  w.isa = isa;
  w.int4 = true;
  w.group = group;
  w.groups = k / group;
  const int64_t blocks = (n + kInt4Cols - 1) / kInt4Cols;
  const size_t codes = size_t(blocks * k * kInt4Cols / 2), params = size_t(blocks * w.groups * kInt4Cols);
  w.codes = make_buffer<uint8_t>(codes);
  w.scales = make_buffer<float>(params);
  w.zeros = make_buffer<uint8_t>(params);
  w.bytes = codes + params * (sizeof(float) + 1);
  return w;
}

PackedWeights pack_int4_weights(const uint8_t* codes, const float* scales, const uint8_t* zeros,
                                int64_t n, int64_t k, int64_t group, Isa isa) {
  PackedWeights w = make_int4_weights(n, k, group, isa);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kk = 0; kk < k; ++kk) set_int4_code(w, j, kk, codes[j * k + kk]);
    for (int64_t g = 0; g < w.groups; ++g) {
      w.scales[int4_group_index(w, j, g)] = scales[j * w.groups + g];
      w.zeros[int4_group_index(w, j, g)] = zeros[j * w.groups + g];
    }
  }
  return w;
}

void* thread_scratch(int slot, size_t bytes) {
  struct Scratch {
    Buffer<uint8_t> data;
    size_t bytes = 0;
  };
  thread_local Scratch scratch[2];
  Scratch& s = scratch[slot];
  if (s.bytes < bytes) {
    s.data = make_buffer<uint8_t>(bytes);
    s.bytes = bytes;
  }
  return s.data.get();
}

// Weights are packed for one instruction set, so the matrix, not active_isa(), decides.
void matmul(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y, int64_t ldy,
            bool accumulate, int member, int n_members, std::atomic<int64_t>* pool) {
  if (m <= 0) return;
  const KernelTable& t = kernel_table(w.isa);
  (w.int4 ? t.matmul_int4 : w.fp8 ? t.matmul_fp8 : t.matmul)(x, m, ldx, w, y, ldy, accumulate, member, n_members, pool);
}

}  // namespace ellm
