#pragma once
// The Qwen2-VL image processor (transformers' image_processing_qwen2_vl.py, which Qwen3-VL,
// Qwen3.5, Qwen3.6 and Qwen3.8 use): an RGB image to the vision tower's input rows. The image is
// resized so both sides are multiples of patch x merge (32) within the pixel budget, scaled to
// [-1, 1] with the checkpoint's mean and std, repeated into temporal_patch_size frames and cut
// into patches ordered by 2x2 merge block.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <utility>
#include <vector>

#include "image/decode.h"

namespace ellm {

struct ImageProcessorConfig {
  // transformers' defaults, for keys a preprocessor_config.json leaves out.
  int64_t min_pixels = 56 * 56, max_pixels = 28 * 28 * 1280;
  int patch_size = 16, temporal_patch_size = 2, merge_size = 2;
  float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
  float std[3] = {0.26862954f, 0.26130258f, 0.27577711f};

  // The budget is "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels}, or the
  // older top-level "min_pixels" / "max_pixels", which win as in transformers.
  static ImageProcessorConfig from_json(const nlohmann::json& j);
  // <model_dir>/preprocessor_config.json.
  static ImageProcessorConfig load(const std::filesystem::path& model_dir);

  int64_t factor() const { return int64_t(patch_size) * merge_size; }
  int64_t patch_row_size() const {
    return 3 * int64_t(temporal_patch_size) * patch_size * patch_size;
  }
};

struct PreparedImage {
  int64_t grid_t = 0, grid_h = 0, grid_w = 0;  // in patches; grid_t = 1 for a still image
  int64_t merge_size = 2;
  // [grid_t * grid_h * grid_w][3 * temporal * patch * patch]: each row channel, frame, y, x;
  // rows by merge block (block row, block column, row in block, column in block).
  std::vector<float> pixel_values;
  // Of the grid and the pixel values: the image's identity for the session cache.
  uint64_t content_hash = 0;

  int64_t n_patches() const { return grid_t * grid_h * grid_w; }
  int64_t n_tokens() const { return n_patches() / (merge_size * merge_size); }
  int64_t merged_h() const { return grid_h / merge_size; }
  int64_t merged_w() const { return grid_w / merge_size; }
};

// The resized (height, width): transformers' smart_resize with factor patch x merge, Python's
// round (halves to even). Throws for an aspect ratio over 200, as transformers does.
std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width,
                                         const ImageProcessorConfig& config);

PreparedImage prepare_image(const RgbImage& image, const ImageProcessorConfig& config);

}  // namespace ellm
