#pragma once
// The AVX2 tier (AVX2, FMA, F16C): its own matrix product; the element-wise kernels and
// attention are the shared templates (kernels/simd_*.h).
// Exported through avx2_kernels (kernel_table.h); only this folder includes this header.
#include "kernels/kernel_table.h"

namespace ellm::avx2 {

PackWeightsFn pack_weights;
MatmulFn matmul;
MatmulFn matmul_fp8;  // every m: decode rows by simd::matmul_fp8, prefill its own
MatmulFn matmul_int4;  // int4.cc: every m, BF16 or int8 inputs
MatmulFn matmul_int4_vnni;  // int4_vnni.cc: int8 inputs on AVX-VNNI

}  // namespace ellm::avx2
