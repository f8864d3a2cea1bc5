#pragma once
// 4-bit checkpoints for make-model and the tests: a linear weight's values quantised by rounding
// to nearest on GPTQ's symmetric grid (v1 files: zeros stored minus 1) or AWQ's asymmetric one
// (shared/golden/README.md), and the module tensors of either layout.
#include <cstdint>
#include <string>
#include <vector>

#include "model/load/safetensors.h"

namespace ellm {

struct Int4Grid {
  int64_t rows = 0, k = 0, group = 0;
  std::vector<uint8_t> codes;     // [rows][k]
  std::vector<uint16_t> scales;   // [k / group][rows] FP16
  std::vector<uint8_t> zeros;     // [k / group][rows]
  float value(int64_t o, int64_t i) const;  // scale x (q - zero), exactly
};

// values: [rows][k]; format "gptq" (symmetric: scale 2 max|w| / 15, zero 8) or "awq" (scale
// (max - min) / 15, zero -round(min / scale)); scales rounded to FP16 first.
Int4Grid quantise_int4_grid(const std::vector<float>& values, int64_t rows, int64_t k,
                            int64_t group, const std::string& format);

// The tensors replacing `weight` (<module>.weight [rows][k]) in groups of `group` inputs:
// qweight, qzeros, scales (and GPTQ's g_idx), in that order.
std::vector<TensorSpec> int4_module_tensors(const TensorSpec& weight, const std::string& format,
                                            int64_t group);

// Elements [first, first + count) of the module tensor named `name` (one of the above) as bytes.
void int4_tensor_bytes(const Int4Grid& grid, const std::string& format, const std::string& name,
                       int64_t first, int64_t count, uint8_t* out);

}  // namespace ellm
