// The AMX tier's kernel table: the matrix product and the attention block on BF16 products; the
// entries left out come from the AVX-512 tier (dispatch.cc).
#include "kernels/amx/amx.h"

namespace ellm {

const KernelTable amx_kernels = {
    // nullptr: the AVX-512 tier's (dispatch.cc fills them in).
    .convert_f32_to_bf16 = nullptr,
    .convert_bf16_to_f32 = nullptr,
    .convert_fp8_e4m3_to_f32 = nullptr,
    .convert_f32_to_f16 = nullptr,
    .rmsnorm = nullptr,
    .norm_rope = nullptr,
    .rope_partial = nullptr,
    .silu_mul = nullptr,
    .softmax_exp = nullptr,
    .gelu_tanh = nullptr,
    .dot_rows_f32 = nullptr,
    .dot_rows_fp8 = nullptr,
    .conv1d_silu = nullptr,
    .l2norm = nullptr,
    .gated_rmsnorm = nullptr,
    .gated_delta_step = nullptr,
    .gated_delta_chunk = nullptr,
    .pack_weights = nullptr,  // the AVX-512 layout: the AMX product reads it
    .matmul = amx::matmul,
    // The AVX-512 FP8 product for every row count, so a row is the same bits in any pass; an
    // AMX one would need the same per-128-k arithmetic in decode and prefill (not written yet).
    .matmul_fp8 = nullptr,
    .matmul_int4 = nullptr,
    // FP32 attention: the AVX-512 tier's; on BF16 products (attention_bf16_products) the tiles.
    .attention_tile_rows = 0,
    .attention_block = nullptr,
    .attention_block_bf16 = nullptr,
    .attention_block_fp8 = nullptr,
    .attention_block_int8 = nullptr,
    .attention_scratch_floats = nullptr,
    .forget_attention_scratch = nullptr,
    .all_heads_supports = nullptr,
    .attention_block_all_heads = nullptr,
    .attention_block_all_heads_bf16 = nullptr,
    .attention_block_all_heads_fp8 = nullptr,
    .attention_block_all_heads_int8 = nullptr,
    .attention_bf16_products = {amx::attention_block, amx::attention_block_scratch_floats,
                                amx::clear_attention_cache},
};

}  // namespace ellm
