#pragma once
// make-model's vision towers: the tower shape of each Qwen3.5-generation preset, its tensors in
// Hugging Face layout (model.visual.*, BF16 whatever the decoder's dtype, as Qwen ships them),
// and the config files that describe it.
#include <optional>
#include <string>
#include <vector>

#include "model/load/safetensors.h"
#include "model/vision/vision_config.h"
#include "tools/make_model.h"

namespace ellm {

// The tower of a preset whose decoder is text_hidden wide (Qwen3.5, Qwen3.6, Qwen3.8-Flash-Next);
// nothing for the presets without one (Qwen3).
std::optional<VisionConfig> preset_vision_config(const std::string& preset, int64_t text_hidden);

// Every tensor of the tower, with its name and shape.
std::vector<TensorSpec> vision_tensors(const VisionConfig& vision);

// config.json text with the tower added: vision_config, language_model_only false, and the
// image token ids the tokenizer defines (those it lacks are left out).
std::string with_vision_config(const std::string& config_json, const VisionConfig& vision,
                               const SpecialTokenIds& special);

// preprocessor_config.json as Qwen3.5 ships it (the Qwen2-VL processor's keys: min and max pixels
// in size.shortest_edge / longest_edge, mean and std 0.5).
std::string preprocessor_config_json(const VisionConfig& vision);

}  // namespace ellm
