#pragma once
// The AMX tier (AMX-BF16 on top of AVX-512): its own matrix product (on the AVX-512 packed
// layout) and attention block on BF16 products (rows <= 256, head_dim a multiple of 32 up to 256;
// other shapes go to the AVX-512 kernels). Everything else is the AVX-512 tier's. Exported
// through amx_kernels (kernel_table.h); only this folder includes this header.
#include "kernels/kernel_table.h"

namespace ellm::amx {

MatmulFn matmul;
// Attention on BF16 products (Bf16AttentionKernels in kernel_table.h).
AttentionBlockFn attention_block;
// Its acc must have room for `rows` rounded up to 16: it reads those padding rows and writes them
// back unchanged. Its s is larger than the other tiers' (it keeps the blocks it packed for the
// rest of the pass): this many floats. clear_attention_cache(s) forgets them.
size_t attention_block_scratch_floats(int64_t head_dim);
void clear_attention_cache(float* s);

}  // namespace ellm::amx
