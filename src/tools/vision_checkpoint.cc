#include "tools/vision_checkpoint.h"

#include <nlohmann/json.hpp>

namespace ellm {

std::optional<VisionConfig> preset_vision_config(const std::string& preset, int64_t text_hidden) {
  VisionConfig v;
  v.num_position_embeddings = 48 * 48;
  v.out_hidden_size = text_hidden;
  // 0.8B's tower as its config.json gives it; the large checkpoints' 27-block tower (333
  // model.visual.* tensors) at Qwen3-VL's large width.
  if (preset == "qwen3.5-0.8b") {
    v.depth = 12, v.hidden_size = 768, v.num_heads = 12, v.intermediate_size = 3072;
  } else if (preset == "qwen3.6-27b" || preset == "qwen3.6-35b-a3b" || preset == "qwen3.8-flash-next") {
    v.depth = 27, v.hidden_size = 1152, v.num_heads = 16, v.intermediate_size = 4304;
  } else if (preset == "tiny-qwen4exp") {  // as ../shared/models/tiny-qwen4exp
    v.depth = 1, v.hidden_size = 32, v.num_heads = 2, v.intermediate_size = 64, v.num_position_embeddings = 16;
  } else {
    return std::nullopt;
  }
  return v;
}

std::vector<TensorSpec> vision_tensors(const VisionConfig& v) {
  const std::string p = "model.visual.";
  const int64_t H = v.hidden_size, I = v.intermediate_size, M = v.merged_width();
  std::vector<TensorSpec> specs;
  auto linear = [&](const std::string& name, int64_t n, int64_t k) {
    specs.push_back({name + ".weight", {n, k}});
    specs.push_back({name + ".bias", {n}});
  };
  auto norm = [&](const std::string& name, int64_t n) {
    specs.push_back({name + ".weight", {n}});
    specs.push_back({name + ".bias", {n}});
  };
  specs.push_back({p + "patch_embed.proj.weight",
                   {H, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size}});
  specs.push_back({p + "patch_embed.proj.bias", {H}});
  specs.push_back({p + "pos_embed.weight", {v.num_position_embeddings, H}});
  for (int64_t l = 0; l < v.depth; ++l) {
    const std::string b = p + "blocks." + std::to_string(l) + ".";
    norm(b + "norm1", H);
    linear(b + "attn.qkv", 3 * H, H);
    linear(b + "attn.proj", H, H);
    norm(b + "norm2", H);
    linear(b + "mlp.linear_fc1", I, H);
    linear(b + "mlp.linear_fc2", H, I);
  }
  norm(p + "merger.norm", H);
  linear(p + "merger.linear_fc1", M, M);
  linear(p + "merger.linear_fc2", v.out_hidden_size, M);
  return specs;
}

std::string with_vision_config(const std::string& config_json, const VisionConfig& v,
                               const SpecialTokenIds& special) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(config_json);
  for (auto [key, id] : {std::pair{"image_token_id", special.image_pad},
                         {"video_token_id", special.video_pad},
                         {"vision_start_token_id", special.vision_start},
                         {"vision_end_token_id", special.vision_end}})
    if (id >= 0) j[key] = id;
  j["language_model_only"] = false;
  nlohmann::ordered_json vision;
  vision["deepstack_visual_indexes"] = nlohmann::ordered_json::array();
  vision["depth"] = v.depth;
  vision["hidden_act"] = v.tanh_gelu ? "gelu_pytorch_tanh" : "gelu";
  vision["hidden_size"] = v.hidden_size;
  vision["in_channels"] = v.in_channels;
  vision["initializer_range"] = 0.02;
  vision["intermediate_size"] = v.intermediate_size;
  vision["model_type"] = "qwen3_5";
  vision["num_heads"] = v.num_heads;
  vision["num_position_embeddings"] = v.num_position_embeddings;
  vision["out_hidden_size"] = v.out_hidden_size;
  vision["patch_size"] = v.patch_size;
  vision["spatial_merge_size"] = v.spatial_merge_size;
  vision["temporal_patch_size"] = v.temporal_patch_size;
  j["vision_config"] = vision;
  return j.dump(2) + "\n";
}

std::string preprocessor_config_json(const VisionConfig& v) {
  nlohmann::ordered_json j;
  j["size"] = {{"longest_edge", 16777216}, {"shortest_edge", 65536}};
  j["patch_size"] = v.patch_size;
  j["temporal_patch_size"] = v.temporal_patch_size;
  j["merge_size"] = v.spatial_merge_size;
  j["image_mean"] = {0.5, 0.5, 0.5};
  j["image_std"] = {0.5, 0.5, 0.5};
  j["processor_class"] = "Qwen3VLProcessor";
  j["image_processor_type"] = "Qwen2VLImageProcessorFast";
  return j.dump(2) + "\n";
}

}  // namespace ellm
