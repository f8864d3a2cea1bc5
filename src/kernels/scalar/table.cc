// The scalar tier's kernel table.
#include <cstdint>

#include "kernels/scalar/scalar.h"

namespace ellm {

const KernelTable scalar_kernels = {
    .convert_f32_to_bf16 = scalar::convert_f32_to_bf16,
    .convert_bf16_to_f32 = scalar::convert_bf16_to_f32,
    .convert_fp8_e4m3_to_f32 = scalar::convert_fp8_e4m3_to_f32,
    .convert_f32_to_f16 = scalar::convert_f32_to_f16,
    .rmsnorm = scalar::rmsnorm,
    .norm_rope = scalar::norm_rope,
    .rope_partial = scalar::rope_partial,
    .silu_mul = scalar::silu_mul,
    .softmax_exp = scalar::softmax_exp,
    .gelu_tanh = scalar::gelu_tanh,
    .dot_rows_f32 = scalar::dot_rows_f32,
    .dot_rows_fp8 = scalar::dot_rows_fp8,
    .conv1d_silu = scalar::conv1d_silu,
    .l2norm = scalar::l2norm,
    .gated_rmsnorm = scalar::gated_rmsnorm,
    .gated_delta_step = scalar::gated_delta_step,
    .gated_delta_chunk = scalar::gated_delta_chunk,
    .pack_weights = scalar::pack_weights,
    .matmul = scalar::matmul,
    .matmul_fp8 = scalar::matmul_fp8,
    .matmul_int4 = scalar::matmul_int4,
    .attention_tile_rows = 32,
    .attention_block = scalar::attention_block_of<KvDtype::f16>,
    .attention_block_bf16 = scalar::attention_block_of<KvDtype::bf16>,
    .attention_block_fp8 = scalar::attention_block_of<KvDtype::fp8>,
    .attention_block_int8 = scalar::attention_block_of<KvDtype::int8>,
    .attention_scratch_floats = default_attention_scratch_floats,
    .forget_attention_scratch = nullptr,
    .all_heads_supports = qwen3_decode_shapes,
    .attention_block_all_heads = scalar::all_heads_of<KvDtype::f16>,
    .attention_block_all_heads_bf16 = scalar::all_heads_of<KvDtype::bf16>,
    .attention_block_all_heads_fp8 = scalar::all_heads_of<KvDtype::fp8>,
    .attention_block_all_heads_int8 = scalar::all_heads_of<KvDtype::int8>,
    .attention_bf16_products = {nullptr, nullptr, nullptr},
};

}  // namespace ellm
