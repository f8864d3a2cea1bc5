// The AVX2 tier's kernel table.
#include "kernels/avx2/avx2.h"
#include "kernels/simd_kernels.h"
#include "kernels/vec_avx2.h"

namespace ellm {

const KernelTable avx2_kernels = simd::kernel_table<Avx2Vec>(avx2::pack_weights, avx2::matmul);

}  // namespace ellm
