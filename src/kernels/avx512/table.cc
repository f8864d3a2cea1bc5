// The AVX-512 tier's kernel table.
#include "kernels/avx512/avx512.h"
#include "kernels/simd_kernels.h"
#include "kernels/vec_avx512.h"

namespace ellm {

const KernelTable avx512_kernels =
    simd::kernel_table<Avx512Vec>(avx512::pack_weights, avx512::matmul,
                                  simd::matmul_fp8<Avx512Vec>, simd::kFp8DecodeRows,
                                  avx512::fp8_to_packed_bf16);

}  // namespace ellm
