#include "model/vision/vision_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "model/config_fields.h"

namespace ellm {

using nlohmann::json;

int64_t VisionConfig::position_side() const {
  return int64_t(std::lround(std::sqrt(double(num_position_embeddings))));
}

std::optional<VisionConfig> parse_vision_config(const json& root, const std::string& where) {
  if (get_bool(root, where, "language_model_only", false)) return std::nullopt;
  auto found = root.find("vision_config");
  if (found == root.end() || found->is_null()) return std::nullopt;
  if (!found->is_object()) fail(where, "field 'vision_config' must be an object");
  const json& j = *found;
  const std::string in = where + " vision_config";
  VisionConfig v;
  v.depth = get_int(j, in, "depth", true);
  v.hidden_size = get_int(j, in, "hidden_size", true);
  v.num_heads = get_int(j, in, "num_heads", true);
  v.intermediate_size = get_int(j, in, "intermediate_size", true);
  v.out_hidden_size = get_int(j, in, "out_hidden_size", true);
  v.num_position_embeddings = get_int(j, in, "num_position_embeddings", true);
  v.patch_size = get_int(j, in, "patch_size", false, v.patch_size);
  v.temporal_patch_size = get_int(j, in, "temporal_patch_size", false, v.temporal_patch_size);
  v.spatial_merge_size = get_int(j, in, "spatial_merge_size", false, v.spatial_merge_size);
  v.in_channels = get_int(j, in, "in_channels", false, v.in_channels);
  for (auto [key, value] : {std::pair{"depth", v.depth}, {"hidden_size", v.hidden_size},
                            {"num_heads", v.num_heads}, {"intermediate_size", v.intermediate_size},
                            {"out_hidden_size", v.out_hidden_size},
                            {"num_position_embeddings", v.num_position_embeddings},
                            {"patch_size", v.patch_size}, {"temporal_patch_size", v.temporal_patch_size},
                            {"spatial_merge_size", v.spatial_merge_size}, {"in_channels", v.in_channels}})
    require_positive(in, key, value);
  if (v.hidden_size % v.num_heads)
    fail(in, "hidden_size " + std::to_string(v.hidden_size) + " is not divisible by num_heads " +
                 std::to_string(v.num_heads));
  // The rotary half of each head splits evenly between the row and the column angles.
  if (v.head_dim() % 4)
    fail(in, "head_dim " + std::to_string(v.head_dim()) + " (hidden_size / num_heads) must be a "
                                                          "multiple of 4 for the 2-D rotary");
  if (v.position_side() * v.position_side() != v.num_position_embeddings)
    fail(in, "num_position_embeddings " + std::to_string(v.num_position_embeddings) +
                 " is not a square (side x side learned positions)");
  std::string act = "gelu_pytorch_tanh";
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) fail(in, "field 'hidden_act' must be a string");
    act = it->get<std::string>();
  }
  if (act != "gelu_pytorch_tanh" && act != "gelu")
    fail(in, "hidden_act '" + act + "' is not supported (gelu_pytorch_tanh or gelu)");
  v.tanh_gelu = act == "gelu_pytorch_tanh";
  if (auto it = j.find("deepstack_visual_indexes");
      it != j.end() && it->is_array() && !it->empty())
    fail(in, "deepstack_visual_indexes is not supported (Qwen3.5's tower has no DeepStack)");
  return v;
}

std::optional<VisionConfig> read_vision_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::ifstream f(path);
  if (!f) fail(path, "cannot open (is this a Hugging Face model folder?)");
  std::stringstream text;
  text << f.rdbuf();
  json root = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) fail(path, "is not valid JSON");
  return parse_vision_config(root, path);
}

}  // namespace ellm
