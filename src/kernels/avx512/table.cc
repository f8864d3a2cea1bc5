// The AVX-512 tier's kernel table.
#include "kernels/avx512/avx512.h"
#include "kernels/simd_kernels.h"
#include "kernels/vec_avx512.h"

namespace ellm {

const KernelTable avx512_kernels =
    simd::kernel_table<Avx512Vec>(avx512::pack_weights, avx512::matmul, avx512::matmul_fp8,
                                  avx512::matmul_int4);

}  // namespace ellm
