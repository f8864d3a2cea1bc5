#include "image/processor.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "base/error.h"
#include "base/hash.h"
#include "image/resize.h"

namespace ellm {

namespace {

constexpr const char* kWhere = "preprocessor_config.json";

int64_t positive_int(const nlohmann::json& j, const char* key, int64_t fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number_integer() || j[key].get<int64_t>() <= 0)
    fail(kWhere, std::string("'") + key + "' must be a positive integer");
  return j[key].get<int64_t>();
}

void per_channel(const nlohmann::json& j, const char* key, float out[3]) {
  if (!j.contains(key) || j[key].is_null()) return;
  const nlohmann::json& v = j[key];
  if (v.is_number()) {
    out[0] = out[1] = out[2] = v.get<float>();
    return;
  }
  if (!v.is_array() || v.size() != 3 || !v[0].is_number() || !v[1].is_number() || !v[2].is_number())
    fail(kWhere, std::string("'") + key + "' must be a number or a list of 3 numbers");
  for (int c = 0; c < 3; ++c) out[c] = v[c].get<float>();
}

// Python's round(): halves go to the even neighbour.
double round_half_even(double x) {
  double floor = std::floor(x), rest = x - floor;
  if (rest > 0.5 || (rest == 0.5 && std::fmod(floor, 2.0) != 0.0)) return floor + 1.0;
  return floor;
}

}  // namespace

ImageProcessorConfig ImageProcessorConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) fail(kWhere, "is not a JSON object");
  ImageProcessorConfig config;
  if (j.contains("size") && !j["size"].is_null()) {
    const nlohmann::json& size = j["size"];
    if (!size.is_object() || !size.contains("shortest_edge") || !size.contains("longest_edge"))
      fail(kWhere, "'size' must hold 'shortest_edge' and 'longest_edge' (min and max pixels)");
    config.min_pixels = positive_int(size, "shortest_edge", 0);
    config.max_pixels = positive_int(size, "longest_edge", 0);
  }
  config.min_pixels = positive_int(j, "min_pixels", config.min_pixels);
  config.max_pixels = positive_int(j, "max_pixels", config.max_pixels);
  config.patch_size = int(positive_int(j, "patch_size", config.patch_size));
  config.temporal_patch_size =
      int(positive_int(j, "temporal_patch_size", config.temporal_patch_size));
  config.merge_size = int(positive_int(j, "merge_size", config.merge_size));
  per_channel(j, "image_mean", config.mean);
  per_channel(j, "image_std", config.std);
  if (config.min_pixels > config.max_pixels)
    fail(kWhere, "min pixels (" + std::to_string(config.min_pixels) + ") exceed max pixels (" +
                     std::to_string(config.max_pixels) + ")");
  if (config.patch_size > 1024 || config.merge_size > 64 || config.temporal_patch_size > 64)
    fail(kWhere, "patch_size, merge_size or temporal_patch_size is implausibly large");
  for (int c = 0; c < 3; ++c)
    if (!(config.std[c] != 0.0f) || !std::isfinite(config.std[c]) || !std::isfinite(config.mean[c]))
      fail(kWhere, "image_std must be finite and non-zero, image_mean finite");
  return config;
}

ImageProcessorConfig ImageProcessorConfig::load(const std::filesystem::path& model_dir) {
  const std::filesystem::path path = model_dir / "preprocessor_config.json";
  std::ifstream in(path);
  if (!in) fail(path.string(), "cannot be read (a vision model needs its image processor config)");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) fail(path.string(), "is not valid JSON");
  return from_json(j);
}

std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width,
                                         const ImageProcessorConfig& config) {
  if (height <= 0 || width <= 0) fail("image", "has an empty size");
  const double ratio = double(std::max(height, width)) / double(std::min(height, width));
  if (ratio > 200)
    fail("image", std::to_string(width) + "x" + std::to_string(height) +
                      " has an aspect ratio over 200, which the vision model does not take");
  // The same double operations in the same order as transformers' Python, so ties and
  // near-ties land on the same side.
  const double factor = double(config.factor()), h = double(height), w = double(width);
  double h_bar = round_half_even(h / factor) * factor, w_bar = round_half_even(w / factor) * factor;
  if (h_bar * w_bar > double(config.max_pixels)) {
    const double beta = std::sqrt(h * w / double(config.max_pixels));
    h_bar = std::max(factor, std::floor(h / beta / factor) * factor);
    w_bar = std::max(factor, std::floor(w / beta / factor) * factor);
  } else if (h_bar * w_bar < double(config.min_pixels)) {
    const double beta = std::sqrt(double(config.min_pixels) / (h * w));
    h_bar = std::ceil(h * beta / factor) * factor;
    w_bar = std::ceil(w * beta / factor) * factor;
  }
  return {int64_t(h_bar), int64_t(w_bar)};
}

PreparedImage prepare_image(const RgbImage& image, const ImageProcessorConfig& config) {
  const auto [height, width] = smart_resize(image.height, image.width, config);
  const RgbImage resized = height == image.height && width == image.width
                               ? RgbImage{}
                               : resize_bicubic(image, width, height);
  const RgbImage& pixels = resized.rgb.empty() ? image : resized;

  // transformers' arithmetic: x * (1/255) in double, to float32, then (v - mean) / std in float32.
  float level[3][256];
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v)
      level[c][v] = (float(v * (1.0 / 255.0)) - config.mean[c]) / config.std[c];

  const int64_t patch = config.patch_size, merge = config.merge_size;
  const int64_t frames = config.temporal_patch_size;
  PreparedImage out;
  out.grid_t = 1;
  out.grid_h = height / patch;
  out.grid_w = width / patch;
  out.merge_size = merge;
  out.pixel_values.resize(size_t(out.n_patches() * config.patch_row_size()));
  float* row = out.pixel_values.data();
  for (int64_t block_y = 0; block_y < out.grid_h / merge; ++block_y)
    for (int64_t block_x = 0; block_x < out.grid_w / merge; ++block_x)
      for (int64_t in_y = 0; in_y < merge; ++in_y)
        for (int64_t in_x = 0; in_x < merge; ++in_x) {
          const int64_t top = (block_y * merge + in_y) * patch,
                        left = (block_x * merge + in_x) * patch;
          for (int c = 0; c < 3; ++c)
            for (int64_t frame = 0; frame < frames; ++frame)  // a still image: equal frames
              for (int64_t y = 0; y < patch; ++y)
                for (int64_t x = 0; x < patch; ++x)
                  *row++ = level[c][pixels.pixel(left + x, top + y)[c]];
        }
  const int64_t grid[4] = {out.grid_t, out.grid_h, out.grid_w, merge};
  out.content_hash = hash_bytes(out.pixel_values.data(), out.pixel_values.size() * sizeof(float),
                                hash_bytes(grid, sizeof grid));
  return out;
}

}  // namespace ellm
