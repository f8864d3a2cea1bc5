#pragma once
// Bicubic resize as PIL's Image.resize(size, BICUBIC) does it, which transformers' Qwen2-VL
// image processor calls: the same pixels, so the vision tower sees what it was trained on.
#include <cstdint>

#include "image/decode.h"

namespace ellm {

RgbImage resize_bicubic(const RgbImage& image, int64_t width, int64_t height);

}  // namespace ellm
