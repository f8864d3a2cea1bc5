#pragma once
// The vision tower of Qwen3.5 / Qwen3.6 / Qwen3.8 (transformers' Qwen3_5VisionModel: the Qwen3-VL
// encoder without DeepStack): preprocessed pixel values in, the merged rows that replace an
// image's <|image_pad|> embeddings out.
//   x = patch_embed(pixels) + interpolated learned positions
//   depth x { x += proj(attention(rope2d(qkv(LayerNorm(x))))); x += fc2(gelu(fc1(LayerNorm(x)))) }
//   rows = fc2(gelu_erf(fc1(concat of each merge block's LayerNorm(x) rows)))
// Weights stay BF16 as the checkpoint keeps them (also beside an FP8 decoder); products run on
// the tier's BF16 matrix kernels, attention in FP32 (vision_attention.h).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/memory.h"
#include "base/threads.h"
#include "kernels/kernels.h"
#include "model/vision/vision_config.h"
#include "model/vision/vision_ops.h"

namespace ellm {

struct VisionBlockWeights {
  VisionNorm norm1, norm2;  // [hidden]
  VisionLinear qkv;         // [3 hidden][hidden]: q, k, v, each heads x head_dim
  VisionLinear proj;        // [hidden][hidden]
  VisionLinear fc1;         // [intermediate][hidden]
  VisionLinear fc2;         // [hidden][intermediate]
};

struct VisionWeights {
  VisionLinear patch_embed;      // [hidden][in_channels x temporal x patch x patch] (the Conv3d)
  Buffer<float> position_table;  // [side x side][hidden]
  std::vector<VisionBlockWeights> blocks;
  VisionNorm merger_norm;   // [hidden]
  VisionLinear merger_fc1;  // [merged_width][merged_width]
  VisionLinear merger_fc2;  // [out_hidden][merged_width]
  size_t bytes = 0;
};

class VisionTower {
 public:
  // Reads model.visual.* (or visual.*) of the checkpoint in model_dir, each tensor checked
  // against `config`; a missing or misshapen tensor is an Error naming it. The tower's products
  // run on `team`, packed for `isa`.
  static std::unique_ptr<VisionTower> load(const std::string& model_dir, const VisionConfig& config,
                                           ThreadTeam& team, Isa isa = active_isa());
  // The same with the config from <model_dir>/config.json; nullptr when the folder has no tower
  // (no vision_config, or language_model_only).
  static std::unique_ptr<VisionTower> load_if_present(const std::string& model_dir, ThreadTeam& team,
                                                      Isa isa = active_isa());

  const VisionConfig& config() const { return config_; }
  int64_t out_hidden() const { return config_.out_hidden_size; }
  size_t weight_bytes() const { return weights_.bytes; }
  // The merged rows (image tokens) of a grid.
  int64_t tokens(int64_t grid_t, int64_t grid_h, int64_t grid_w) const {
    return grid_t * grid_h * grid_w / config_.merge_unit();
  }

  // pixel_values [grid_t * grid_h * grid_w][patch_values()] (rows in merge-block order, as the
  // Qwen2-VL processor emits them) -> out [tokens()][out_hidden()], merged rows in token order
  // (row-major over the merged grid, frame after frame). Each frame is one attention sequence.
  // The scratch grows to the largest image seen and is kept, so one call at a time; a grid not
  // made of whole merge blocks is an Error.
  void encode(const float* pixel_values, int64_t grid_t, int64_t grid_h, int64_t grid_w, float* out);
  // The same in stages, so that a server can run other work between them: begin_encode checks
  // the grid and embeds the patches; each encode_stage() runs the attention or the MLP of one
  // block, or last the merger, and returns true once `out` holds the rows (the same bits as
  // encode). pixel_values and out must live until then; begin_encode abandons an encoding left
  // unfinished.
  void begin_encode(const float* pixel_values, int64_t grid_t, int64_t grid_h, int64_t grid_w, float* out);
  bool encode_stage();

 private:
  VisionTower(const VisionConfig& config, ThreadTeam& team) : config_(config), team_(team) {}
  void reserve(int64_t patches, int64_t frame_len);
  void run_attention(const VisionBlockWeights& b, int64_t frames, int64_t frame_len);
  void run_mlp(const VisionBlockWeights& b, int64_t frames, int64_t frame_len);
  void run_merger(int64_t patches, float* out);

  VisionConfig config_;
  ThreadTeam& team_;
  VisionWeights weights_;
  struct Scratch {
    int64_t patches = 0, frame_len = 0;  // what it is sized for
    Buffer<float> x, qkv, attention, wide, positions, cos, sin, attention_scratch;
    Buffer<bf16> xb;
  } scratch_;
  struct Encoding {  // begin_encode's image, while its stages run
    float* out = nullptr;  // null: none
    int64_t frames = 0, frame_len = 0;
    int64_t stage = 0;  // 2 per block (attention, MLP), then the merger
  } encoding_;
};

}  // namespace ellm
