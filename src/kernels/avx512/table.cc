// The AVX-512 tier's kernel table: the shared templates with its own products, and its attention
// on BF16 products over an FP16 cache (vdpbf16ps) for shapes that ask for it.
#include "kernels/avx512/avx512.h"
#include "kernels/simd_kernels.h"
#include "kernels/vec_avx512.h"

namespace ellm {
namespace {

constexpr KernelTable avx512_table() {
  KernelTable t = simd::kernel_table<Avx512Vec>(avx512::pack_weights, avx512::matmul,
                                                avx512::matmul_fp8, avx512::matmul_int4);
  t.attention_bf16_products = {avx512::attention_block_bf16_products,
                               avx512::bf16_attention_scratch_floats,
                               avx512::forget_bf16_attention_scratch};
  return t;
}

}  // namespace

const KernelTable avx512_kernels = avx512_table();

}  // namespace ellm
