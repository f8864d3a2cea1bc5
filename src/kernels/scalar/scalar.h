#pragma once
// The scalar tier: plain C++ kernels, the reference the vector tiers are tested against and
// the tails they leave. Exported through scalar_kernels (kernel_table.h); only this folder
// includes this header.
#include "kernels/kernel_table.h"

namespace ellm::scalar {

ConvertF32ToBf16Fn convert_f32_to_bf16;
ConvertBf16ToF32Fn convert_bf16_to_f32;
ConvertFp8ToF32Fn convert_fp8_e4m3_to_f32;
ConvertF32ToF16Fn convert_f32_to_f16;
RmsnormFn rmsnorm;
NormRopeFn norm_rope;
RopePartialFn rope_partial;
SiluMulFn silu_mul;
SoftmaxExpFn softmax_exp;
GeluTanhFn gelu_tanh;
DotRowsF32Fn dot_rows_f32;
Conv1dSiluFn conv1d_silu;
L2normFn l2norm;
GatedRmsnormFn gated_rmsnorm;
GatedDeltaStepFn gated_delta_step;
GatedDeltaChunkFn gated_delta_chunk;
PackWeightsFn pack_weights;
MatmulFn matmul;
MatmulFn matmul_fp8;
MatmulFn matmul_int4;
AttentionBlockFn attention_block;
AllHeadsFn attention_block_all_heads;

}  // namespace ellm::scalar
