// The AVX2 tier's kernel table.
#include <cstdint>

#include "kernels/avx2/avx2.h"
#include "kernels/simd_kernels.h"
#include "kernels/vec_avx2.h"

namespace ellm {

// Its FP8 and INT4 products take every m (prefill included: avx2/matmul.cc).
const KernelTable avx2_kernels = simd::kernel_table<Avx2Vec>(
    avx2::pack_weights, avx2::matmul, avx2::matmul_fp8, avx2::matmul_int4);

}  // namespace ellm
