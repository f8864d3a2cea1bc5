#pragma once
// The vision tower's shape (config.json "vision_config" of Qwen3.5 / Qwen3.6 / Qwen3.8: the
// Qwen3-VL encoder without DeepStack).
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace ellm {

struct VisionConfig {
  int64_t depth = 0, hidden_size = 0, num_heads = 0, intermediate_size = 0, out_hidden_size = 0;
  int64_t patch_size = 16, temporal_patch_size = 2, spatial_merge_size = 2, in_channels = 3;
  int64_t num_position_embeddings = 0;  // a square: side x side learned positions
  bool tanh_gelu = true;  // the blocks' MLP: gelu_pytorch_tanh, or exact "gelu"

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t patch_values() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int64_t merge_unit() const { return spatial_merge_size * spatial_merge_size; }
  int64_t merged_width() const { return hidden_size * merge_unit(); }  // the merger's fc1
  int64_t position_side() const;
};

// The tower of config.json `root`, or nothing when it has no "vision_config" or says
// "language_model_only": true. A field out of range is an Error naming `where` and the field.
std::optional<VisionConfig> parse_vision_config(const nlohmann::json& root, const std::string& where);
// The same from <model_dir>/config.json.
std::optional<VisionConfig> read_vision_config(const std::string& model_dir);

}  // namespace ellm
