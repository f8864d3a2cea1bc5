#pragma once
// A matrix the forward multiplies in FP32 (dot_rows_f32: the same bits on every tier), kept in
// its checkpoint's dtype and widened to FP32 as it is read: BF16 exactly; an FP8 checkpoint's
// E4M3 codes as code x the factor of their 128 x 128 block, the one rounding the loader's
// widening makes. So a product over it gives the bits of the product over the widened matrix,
// from a half (BF16) or a quarter (FP8) of the bytes.
#include <cstdint>

#include "base/memory.h"
#include "kernels/kernels.h"
#include "model/load/safetensors.h"

namespace ellm {

struct SmallMatrix {
  int64_t rows = 0, dim = 0;
  Dtype dtype = Dtype::f32;      // f32, bf16 or f8_e4m3
  Buffer<float> f32;             // [rows][dim]  f32
  Buffer<bf16> b16;              // [rows][dim]  bf16
  Buffer<uint8_t> codes;         // [rows][dim]  f8_e4m3
  Buffer<float> factors;         // [ceil(rows / 128)][ceil(dim / 128)]  f8_e4m3
  explicit operator bool() const { return rows > 0; }
  size_t bytes() const;
  size_t widened_floats() const { return size_t(rows) * size_t(dim); }
};

// Rows [r0, r1) widened to FP32.                                         out: [r1 - r0][dim]
void widen_rows(const SmallMatrix& w, int64_t r0, int64_t r1, float* out);

}  // namespace ellm
