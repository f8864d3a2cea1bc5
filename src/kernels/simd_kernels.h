#pragma once
// The kernel table of a SIMD tier: the shared templates (simd_elementwise.h, simd_gdn.h,
// simd_attention_prefill.h, simd_attention_decode.h) instantiated for its vector traits V, plus
// the tier's own matrix products (BF16, and FP8 for any number of rows). Included by the tier's table.cc, so the templates are
// compiled with the tier's flags.
#include "kernels/kernel_table.h"
#include "kernels/simd_attention_decode.h"
#include "kernels/simd_attention_prefill.h"
#include "kernels/simd_elementwise.h"
#include "kernels/simd_fp8.h"
#include "kernels/simd_gdn.h"

namespace ellm::simd {

template <class V>
constexpr KernelTable kernel_table(PackWeightsFn* pack_weights, MatmulFn* matmul, MatmulFn* matmul_fp8,
                                   MatmulFn* matmul_int4 = nullptr) {
  return {
      .convert_f32_to_bf16 = convert_f32_to_bf16<V>,
      .convert_bf16_to_f32 = convert_bf16_to_f32<V>,
      .convert_fp8_e4m3_to_f32 = convert_fp8_e4m3_to_f32<V>,
      .convert_f32_to_f16 = convert_f32_to_f16<V>,
      .rmsnorm = rmsnorm<V>,
      .norm_rope = norm_rope<V>,
      .rope_partial = nullptr,
      .silu_mul = silu_mul<V>,
      .softmax_exp = softmax_exp<V>,
      .gelu_tanh = gelu_tanh<V>,
      .dot_rows_f32 = dot_rows_f32<V>,
      .dot_rows_fp8 = dot_rows_fp8<V>,
      .conv1d_silu = conv1d_silu<V>,
      .l2norm = l2norm<V>,
      .gated_rmsnorm = gated_rmsnorm<V>,
      .gated_delta_step = gated_delta_step<V>,
      .gated_delta_chunk = gated_delta_chunk<V>,
      .pack_weights = pack_weights,
      .matmul = matmul,
      .matmul_fp8 = matmul_fp8,
      .matmul_int4 = matmul_int4,
      .attention_tile_rows = 32,
      .attention_block = attention_block<V, KvDtype::f16>,
      .attention_block_bf16 = attention_block<V, KvDtype::bf16>,
      .attention_block_fp8 = attention_block<V, KvDtype::fp8>,
      .attention_block_int8 = attention_block<V, KvDtype::int8>,
      .attention_scratch_floats = default_attention_scratch_floats,
      .forget_attention_scratch = nullptr,
      .all_heads_supports = qwen3_decode_shapes,
      .attention_block_all_heads = attention_block_all_heads<V, KvDtype::f16>,
      .attention_block_all_heads_bf16 = attention_block_all_heads<V, KvDtype::bf16>,
      .attention_block_all_heads_fp8 = attention_block_all_heads<V, KvDtype::fp8>,
      .attention_block_all_heads_int8 = attention_block_all_heads<V, KvDtype::int8>,
      .attention_bf16_products = {nullptr, nullptr, nullptr},
  };
}

}  // namespace ellm::simd
