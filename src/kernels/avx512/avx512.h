#pragma once
// The AVX-512 tier (AVX-512 F/BW/VL/DQ, BF16 and VNNI): its own matrix product (vdpbf16ps) and
// prefill attention over an FP16 cache (vdpbf16ps, kernels/bf16_attention.h); the element-wise
// kernels and the other attention kernels are the shared templates (kernels/simd_*.h). Exported
// through avx512_kernels (kernel_table.h); only this folder includes this header.
#include "kernels/kernel_table.h"

namespace ellm::avx512 {

PackWeightsFn pack_weights;
MatmulFn matmul;
MatmulFn matmul_fp8;
MatmulFn matmul_int4;  // int4.cc, every m, BF16 or int8 inputs (AVX-512-VNNI)
// attention_bf16.cc (Bf16AttentionKernels in kernel_table.h): rows <= 256, head_dim a multiple
// of 32 up to 256; other shapes go to the FP32 template.
AttentionBlockFn attention_block_bf16_products;
size_t bf16_attention_scratch_floats(int64_t head_dim);
void forget_bf16_attention_scratch(float* s);

}  // namespace ellm::avx512
