#pragma once
// The AVX2 tier (AVX2, FMA, F16C): its own matrix product; the element-wise kernels and
// attention are the shared templates (kernels/simd_*.h).
// Exported through avx2_kernels (kernel_table.h); only this folder includes this header.
#include "kernels/kernel_table.h"

namespace ellm::avx2 {

PackWeightsFn pack_weights;
MatmulFn matmul;
MatmulFn matmul_fp8;  // every m: decode rows by simd::matmul_fp8, prefill its own
MatmulFn matmul_int4;  // every m: decode rows by int4_decode, prefill on BF16 panels

// INT4 (int4.cc): the decode product (up to int4_decode_rows() rows), x's rows [.., k0 + len)
// as FP32 in the weights' input order, and columns [col0, col0 + cols) as q - zero in BF16 in
// the packed layout of matmul.cc (16-column blocks).
MatmulFn int4_decode;
int64_t int4_decode_rows();
void int4_inputs(const bf16* x, int64_t ldx, int64_t rows, const PackedWeights& w, int64_t k0,
                 int64_t len, float* xf, int64_t ldxf);
void int4_to_bf16(const PackedWeights& w, int64_t col0, int64_t cols, bf16* out);

}  // namespace ellm::avx2
