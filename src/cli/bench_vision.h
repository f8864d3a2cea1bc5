#pragma once
// ellm bench's image row: one screenshot-sized image through the model's vision tower, its time
// and FLOP rate against the tier's BF16 peak measured in the same run.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/model.h"

namespace ellm {

// A synthetic width x height image (a gradient with a pattern, so no resize shortcut applies);
// {"kind": "vision_encode", ...}. The model must have a tower (Model::image_token_id() >= 0).
nlohmann::json bench_vision_encode(Model& model, const std::string& model_path, int64_t width, int64_t height,
                                   double peak_flops);

}  // namespace ellm
