#pragma once
// 4-bit linear weights: GPTQ and AWQ modules read from a checkpoint into the packed INT4 layout
// of kernels.h (converted once, the codes stay 4-bit), and round-to-nearest quantisation of
// other weights (--quantize int4).
#include <cstdint>
#include <string>

#include "kernels/kernels.h"
#include "model/config.h"
#include "model/load/safetensors.h"

namespace ellm {

// A module is 4-bit exactly when the checkpoint holds <module>.qweight instead of .weight.
bool is_int4_module(const SafetensorsStore& store, const std::string& module);

// Inputs per factor of the 4-bit module (shaped [rows][k] as a linear weight), checked against
// its scales' shape.
int64_t int4_module_group(const SafetensorsStore& store, const Int4Quantization& q,
                          const std::string& module, int64_t rows, int64_t k);

// The module's codes, factors and zeros as rows [row0, row0 + rows) of w (k inputs, groups of
// int4_module_group). With act-order g_idx, w.k_order is set from the first part read and
// every later part must have the same order. Every tensor read is checked (dtype, shape,
// g_idx) and released.
void read_int4_module(const SafetensorsStore& store, const Int4Quantization& q,
                     const std::string& module, int64_t rows, int64_t row0, PackedWeights& w);

// The module's weights dequantised, scale * (q - zero) rounded to BF16, into out [rows][k]
// (input order as the checkpoint's BF16 weight).
void dequantise_int4_module(const SafetensorsStore& store, const Int4Quantization& q,
                           const std::string& module, int64_t rows, int64_t k, bf16* out);

// --quantize int4: the group of a k-input matrix (k a multiple of 4; other matrices stay BF16),
// 128 inputs or the largest divisor of k below that is a multiple of 4.
int64_t int4_quantise_group(int64_t k);
// Rows [row0, row0 + rows) of w (fresh: their codes still zero) from the values [rows][k], per row and group on GPTQ's
// asymmetric grid: scale = (max - min) / 15 over the group's values and 0, zero = round(-min /
// scale), q = clamp(round(v / scale) + zero, 0, 15).
void quantise_int4_rows(const float* values, int64_t rows, int64_t row0, PackedWeights& w);
// The same grid for one group: its factor and zero point.
void int4_grid(float min, float max, float* scale, uint8_t* zero);

}  // namespace ellm
