#pragma once
// The AVX-512 tier (AVX-512 F/BW/VL/DQ, BF16 and VNNI): its own matrix product (vdpbf16ps); the
// element-wise kernels and attention are the shared templates (kernels/simd_*.h). Exported
// through avx512_kernels (kernel_table.h); only this folder includes this header.
#include "kernels/kernel_table.h"

namespace ellm::avx512 {

PackWeightsFn pack_weights;
MatmulFn matmul;
MatmulFn matmul_fp8;
MatmulFn matmul_int4;  // int4.cc, every m, BF16 or int8 inputs (AVX-512-VNNI)

}  // namespace ellm::avx512
