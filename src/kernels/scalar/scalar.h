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
DotRowsFp8Fn dot_rows_fp8;
Conv1dSiluFn conv1d_silu;
L2normFn l2norm;
GatedRmsnormFn gated_rmsnorm;
GatedDeltaStepFn gated_delta_step;
GatedDeltaChunkFn gated_delta_chunk;
PackWeightsFn pack_weights;
MatmulFn matmul;
MatmulFn matmul_fp8;
MatmulFn matmul_int4;
// AttentionBlockFn and AllHeadsFn for each KvDtype (attention.cc instantiates them).
template <KvDtype D>
void attention_block_of(const float* q, int64_t ldq, int64_t group, int64_t rows,
                        int64_t first_end, const void* k, const void* v, const float* kf,
                        const float* vf, int64_t ldkv, int64_t p0, int64_t p1, int64_t head_dim,
                        float scale, float* m, float* l, float* acc, float* s);
template <KvDtype D>
void all_heads_of(const float* q, int64_t ldq, int64_t n_kv_heads, int64_t group, int64_t rows,
                  int64_t first_end, const void* k, const void* v, const float* kf,
                  const float* vf, int64_t ldkv, int64_t p0, int64_t p1, int64_t head_dim,
                  float scale, float* m, float* l, float* acc, float* s);

}  // namespace ellm::scalar
