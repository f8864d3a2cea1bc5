#pragma once
// The AVX2 tier (AVX2, FMA, F16C): its own matrix product; the element-wise kernels and
// attention are the shared templates (kernels/simd_*.h).
// Exported through avx2_kernels (kernel_table.h); only this folder includes this header.
#include "kernels/kernel_table.h"

namespace ellm::avx2 {

PackWeightsFn pack_weights;
MatmulFn matmul;
MatmulFn matmul_fp8;  // every m: decode rows by simd::matmul_fp8, prefill its own

}  // namespace ellm::avx2
