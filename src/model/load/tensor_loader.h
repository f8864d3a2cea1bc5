#pragma once
// Reads a checkpoint's tensors as the forward pass uses them, each checked against the shape
// the config gives: norms and small vectors in FP32, matrices packed for the tier's kernels (a
// fused group of tensors as one matrix), FP8 checkpoints' blocks kept FP8, GPTQ/AWQ modules
// kept 4-bit (int4_weights.h), and --quantize fp8 / int4 applied one tensor at a time, so no
// BF16 copy of the model is ever held whole. The pages of each tensor read are released at
// once; the progress line counts the bytes read.
#include <cstdint>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/memory.h"
#include "kernels/kernels.h"
#include "model/config.h"
#include "model/load/safetensors.h"
#include "model/load/small_matrix.h"

namespace ellm {

// The FP8 quantisation rule of --quantize fp8 and `make-model --dtype fp8`: a 128x128 block's
// factor from its largest magnitude (1 for an all-zero block), and each value's code.
inline float fp8_block_factor(float max_magnitude) {
  return max_magnitude > 0 ? max_magnitude / 448.0f : 1.0f;
}
inline uint8_t fp8_quantise(float value, float factor) { return f32_to_fp8_e4m3(value / factor); }

class TensorLoader {
 public:
  // The progress counts every tensor but those under skipped_prefixes (the vision tower, an MTP
  // head not loaded), and read_twice: a tensor read again (a tied embedding, packed as lm_head).
  TensorLoader(const SafetensorsStore& store, const Int4Quantization& int4, Isa isa,
               bool quantize_fp8, bool quantize_int4, bool quantize_lm_head,
               const std::vector<std::string>& skipped_prefixes, const std::string& read_twice = "");
  // A part of the checkpoint loaded on its own (the vision tower): the progress counts only the
  // tensors under `prefix`, and nothing is quantised.
  TensorLoader(const SafetensorsStore& store, Isa isa, const std::string& prefix,
               const std::string& label);

  // The tensor `name`, checked to have exactly `shape` and a float dtype (F8_E4M3 only where
  // allow_fp8: linear weights).
  const TensorInfo& tensor(const std::string& name, const std::vector<int64_t>& shape,
                           bool allow_fp8 = false);
  Buffer<float> vector_f32(const std::string& name, int64_t n);
  // A (1 + w) RMSNorm weight (Qwen3.5), as the weight the kernels multiply by.
  Buffer<float> vector_f32_plus_one(const std::string& name, int64_t n);
  // conv1d.weight [channels][1][taps] as [taps][channels].
  Buffer<float> conv_weight(const std::string& name, int64_t channels, int64_t taps);
  // A matrix the forward multiplies in FP32; an F8_E4M3 one (an FP8 checkpoint's) as code x its
  // block's factor.
  Buffer<float> matrix_f32(const std::string& name, int64_t rows, int64_t cols);
  // The same matrix kept in the file's dtype where SmallMatrix reads it (F32, BF16, F8_E4M3 with
  // its block factors; F16 widened to F32): the same values, in a half or a quarter of the bytes.
  SmallMatrix small_matrix(const std::string& name, int64_t rows, int64_t cols);
  // Packs the row-wise concatenation of tensors names[i] ([rows[i]][k] each) as one matrix: as
  // INT4 when a part is a 4-bit module; INT4 when quantising to INT4 (`quantizable`: a decoder
  // layer's weight; or lm_head, with quantize_lm_head); FP8 when every part is FP8 in the file,
  // or when quantising to FP8 and no part is FP8 with rows that do not fit; else BF16.
  PackedWeights packed(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
                       int64_t k, bool quantizable = true, bool lm_head = false);
  // A tensor of any `shape` (a convolution's weight) packed as [elements / k][k], never quantised.
  PackedWeights packed_reshaped(const std::string& name, const std::vector<int64_t>& shape, int64_t k);
  // Matrix `index` of the 3-D tensor `name` [count][rows][k] (fused experts), packed alone.
  PackedWeights packed_slice(const std::string& name, int64_t count, int64_t rows, int64_t k,
                             int64_t index);
  // The embedding table [vocab][hidden] as BF16 rows: the mapped checkpoint's when it is BF16
  // (it stays mapped), else converted into `copy`.
  const bf16* embedding(const std::string& name, int64_t vocab, int64_t hidden, Buffer<bf16>& copy);

  const SafetensorsStore& store() const { return store_; }
  size_t bytes() const { return bytes_; }
  size_t fp8_bytes() const { return fp8_bytes_; }
  size_t int4_bytes() const { return int4_bytes_; }
  void finish(const std::string& summary);

 private:
  void done(const TensorInfo& t);
  void show_progress();
  PackedWeights pack_parts(const std::vector<const TensorInfo*>& parts, int64_t k,
                           bool quantizable, bool lm_head = false);
  static std::string module_of(const std::string& weight);
  PackedWeights packed_int4(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
                            int64_t k);
  void to_bf16(const TensorInfo& t, bf16* out);
  void quantise_int4(const TensorInfo& t, int64_t row0, PackedWeights& w);
  std::vector<float> fp8_factors(const TensorInfo& t);
  static float fp8_value(const TensorInfo& t, const std::vector<float>& factors, int64_t e);
  void copy_fp8(const TensorInfo& t, int64_t row0, PackedWeights& w);
  void quantise(const TensorInfo& t, int64_t row0, PackedWeights& w);

  SharedHugePagesScope huge_pages_;  // the weights' mid-sized matrices in shared huge pages
  const SafetensorsStore& store_;
  Isa isa_;
  bool quantize_fp8_, quantize_int4_, quantize_lm_head_;
  Int4Quantization int4_;
  Progress progress_;
  size_t kept_mapped_ = 0;  // bytes read and left mapped (the BF16 embedding)
  size_t bytes_ = 0, fp8_bytes_ = 0, int4_bytes_ = 0;
  std::vector<bf16> scratch_;
};

// How an architecture reads its RMSNorm weights: as stored, or Qwen3.5's (1 + w).
using NormReader = Buffer<float> (TensorLoader::*)(const std::string& name, int64_t n);

}  // namespace ellm
