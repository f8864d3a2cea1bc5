#pragma once
// The AVX-512 tier (AVX-512 F/BW/VL/DQ and BF16): its own matrix product (vdpbf16ps); the
// element-wise kernels and attention are the shared templates (kernels/simd_*.h). Exported
// through avx512_kernels (kernel_table.h); only this folder includes this header.
#include "kernels/kernel_table.h"

namespace ellm::avx512 {

PackWeightsFn pack_weights;
MatmulFn matmul;
MatmulFn matmul_fp8;

}  // namespace ellm::avx512
