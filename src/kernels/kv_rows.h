#pragma once
// Writing and reading one position's row of the KV cache in any KvDtype (layout in kv_dtype.h).
#include <cstdint>

#include "kernels/kernels.h"

namespace ellm {

// Writes one position's K (or V), x [n_kv_heads][head_dim], into a cache row of `dtype` (layout in
// kv_dtype.h), the same bits on every tier. FP16 saturates at +-65504 (f32_to_f16); BF16 rounds
// to nearest even; FP8 takes each head's factor from its amax (clipped to 65504, as FP16 is;
// amax 0: factor 0) and rounds x / factor to nearest even E4M3, saturating at +-448. FP8 has no
// NaN code in the cache: a NaN element becomes 0, so the kernels' widening needs no NaN case.
// int8: factor amax / 127 (amax clipped likewise), codes round(x / factor) to nearest even in
// [-127, 127], NaN 0.
void write_kv_row(const float* x, int64_t n_kv_heads, int64_t head_dim, KvDtype dtype, void* row);

// Element d of head h of a cache row (references and readers outside the attention kernels).
inline float kv_element(const void* row, KvDtype dtype, int64_t n_kv_heads, int64_t head_dim,
                        int64_t h, int64_t d) {
  const int64_t i = h * head_dim + d;
  if (dtype == KvDtype::f16) return f16_to_f32(static_cast<const f16*>(row)[i]);
  if (dtype == KvDtype::bf16) return bf16_to_f32(static_cast<const bf16*>(row)[i]);
  const uint8_t code = static_cast<const uint8_t*>(row)[i];
  const float value = dtype == KvDtype::fp8 ? fp8_e4m3_to_f32(code) : float(int8_t(code));
  return value * kv_row_factors(row, n_kv_heads, head_dim)[h];
}

}  // namespace ellm
