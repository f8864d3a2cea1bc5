#pragma once
// What make-model's writers share, whatever the architecture: the random values (counter-based,
// so an element depends only on its tensor's seed and its index), their FP8 block factors, and
// the files (one model.safetensors, or shards with their index, written streaming).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "model/load/safetensors.h"

namespace ellm {

// The seed of the values of tensor `name` in a model of seed `seed`.
uint64_t tensor_seed(uint64_t seed, const std::string& name);

// Element e of a random tensor as BF16: uniform noise with standard deviation 0.02 (as HF
// initialises), norms near 1 (`norm`).
bf16 random_element(uint64_t seed, int64_t e, bool norm);
// The largest magnitude random_element gives a non-norm element.
float largest_random_element();

// The FP8 factors, [ceil(rows / 128)][ceil(cols / 128)], of the random matrix [rows][cols] of
// seed `seed` whose element e is random_element(seed, first + e, false): fp8_block_factor of each
// block's largest magnitude, rounded up to BF16 where `bf16_factors` (the value a BF16
// weight_scale_inv holds, never below the block's need).
std::vector<float> random_fp8_factors(uint64_t seed, int64_t first, int64_t rows, int64_t cols,
                                      bool bf16_factors = false);
// The factor of element e of [rows][cols] in `factors`.
float block_factor(const std::vector<float>& factors, int64_t cols, int64_t e);

void write_text(const std::string& path, const std::string& text);

// generation_config.json as Qwen ships it (the ids only when known, >= 0).
void write_generation_config(const std::string& out_dir, int32_t endoftext, int32_t im_end);

// Writes the tensors `specs` into out_dir: model.safetensors, or `shards` files of consecutive
// tensors (cut where the running size crosses each file's share) with model.safetensors.index.json,
// showing the progress of the bytes written. Tensors for which `hole` is true take no disk
// (write_safetensors_bytes).
void write_checkpoint_files(const std::string& out_dir, const std::vector<TensorSpec>& specs,
                            int shards, const TensorBytesFill& fill,
                            const std::function<bool(size_t tensor)>& hole = {});

// The bytes of a tensor.
uint64_t tensor_bytes(const TensorSpec& spec);

}  // namespace ellm
