#include "cli/bench_vision.h"

#include <chrono>
#include <vector>

#include "base/error.h"
#include "cli/cli_images.h"
#include "model/vision/vision_config.h"

namespace ellm {
namespace {

// Multiply-adds x 2 of the tower over P patches of one frame: the patch embedding, per block the
// four projections, the MLP and attention's two products (S = P), and the merger.
double tower_flops(const VisionConfig& v, int64_t patches) {
  const double P = double(patches), h = double(v.hidden_size), I = double(v.intermediate_size);
  const double block = P * (4 * h * h + 2 * h * I) + 2 * P * P * h;
  const double merged = double(v.merged_width()), tokens = P / double(v.merge_unit());
  return 2 * (P * double(v.patch_values()) * h + double(v.depth) * block +
              tokens * (merged * merged + merged * double(v.out_hidden_size)));
}

}  // namespace

nlohmann::json bench_vision_encode(Model& model, const std::string& model_path, int64_t width, int64_t height,
                                   double peak_flops) {
  const std::optional<VisionConfig> vision = read_vision_config(model_path);
  if (!vision || model.image_token_id() < 0) fail(model_path, "has no vision tower to benchmark");
  RgbImage image;
  image.width = width;
  image.height = height;
  image.rgb.resize(size_t(width * height * 3));
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      for (int64_t c = 0; c < 3; ++c)
        image.rgb[size_t((y * width + x) * 3 + c)] = uint8_t((x * (c + 1) + y * (3 - c) + ((x ^ y) & 31)) & 255);
  const PreparedImage prepared = prepare_image(image, image_processor_of(model_path));
  std::vector<float> rows(size_t(prepared.n_tokens() * model.config().hidden_size));
  const auto start = std::chrono::steady_clock::now();
  model.encode_image(prepared.pixel_values.data(), prepared.grid_t, prepared.grid_h, prepared.grid_w, rows.data());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double flops = tower_flops(*vision, prepared.n_patches());
  return {{"kind", "vision_encode"},
          {"image", std::to_string(width) + "x" + std::to_string(height)},
          {"patches", prepared.n_patches()},
          {"tokens", prepared.n_tokens()},
          {"seconds", seconds},
          {"tflops", flops / seconds / 1e12},
          {"fraction_of_peak", flops / seconds / peak_flops}};
}

}  // namespace ellm
