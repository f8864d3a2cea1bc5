#include "image/processor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "base/error.h"
#include "image/image_test_util.h"
#include "image/resize.h"

namespace ellm {
namespace {

using nlohmann::json;
using test::error_of;

const std::string kGolden = test::shared_dir() + "/golden/tiny-qwen35-vl";
const std::string kModel = test::shared_dir() + "/models/tiny-qwen35-vl";

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

ImageProcessorConfig with_limits(int64_t min_pixels, int64_t max_pixels) {
  ImageProcessorConfig config;
  config.min_pixels = min_pixels;
  config.max_pixels = max_pixels;
  return config;
}

TEST(ImageProcessorConfig, ReadsTheModelsFile) {
  ImageProcessorConfig config = ImageProcessorConfig::load(kModel);
  EXPECT_EQ(config.min_pixels, 4096);
  EXPECT_EQ(config.max_pixels, 32768);
  EXPECT_EQ(config.patch_size, 16);
  EXPECT_EQ(config.temporal_patch_size, 2);
  EXPECT_EQ(config.merge_size, 2);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(config.mean[c], 0.5f);
    EXPECT_EQ(config.std[c], 0.5f);
  }
}

TEST(ImageProcessorConfig, TopLevelPixelLimitsWinAndBadValuesAreErrors) {
  json j = {{"size", {{"shortest_edge", 100}, {"longest_edge", 1000}}}, {"max_pixels", 5000}};
  EXPECT_EQ(ImageProcessorConfig::from_json(j).min_pixels, 100);
  EXPECT_EQ(ImageProcessorConfig::from_json(j).max_pixels, 5000);
  EXPECT_EQ(ImageProcessorConfig::from_json({{"min_pixels", 7}, {"max_pixels", 9}}).min_pixels, 7);
  auto error = [](json j) { return error_of([&] { ImageProcessorConfig::from_json(j); }); };
  EXPECT_EQ(error({{"size", {{"shortest_edge", 100}}}}),
            "preprocessor_config.json: 'size' must hold 'shortest_edge' and 'longest_edge' (min "
            "and max pixels)");
  EXPECT_EQ(error({{"min_pixels", -1}}),
            "preprocessor_config.json: 'min_pixels' must be a positive integer");
  EXPECT_EQ(error({{"patch_size", "16"}}),
            "preprocessor_config.json: 'patch_size' must be a positive integer");
  EXPECT_EQ(error({{"min_pixels", 10}, {"max_pixels", 5}}),
            "preprocessor_config.json: min pixels (10) exceed max pixels (5)");
  EXPECT_EQ(error({{"image_std", {0.5, 0.0, 0.5}}}),
            "preprocessor_config.json: image_std must be finite and non-zero, image_mean finite");
  EXPECT_EQ(error({{"image_mean", {0.5, 0.5}}}),
            "preprocessor_config.json: 'image_mean' must be a number or a list of 3 numbers");
  EXPECT_EQ(error(json::array()), "preprocessor_config.json: is not a JSON object");
  EXPECT_TRUE(error_of([] { ImageProcessorConfig::load("/nonexistent"); }).find("cannot be read") !=
              std::string::npos);
}

// The golden README's table: every branch of smart_resize, the half-to-even tie included.
TEST(SmartResize, GoldenImagesGetTheReadmesGrids) {
  struct Case {
    const char* file;
    int64_t width, height, resized_w, resized_h, grid_h, grid_w, tokens;
  };
  const Case cases[] = {{"a_64x96.png", 64, 96, 64, 96, 6, 4, 6},
                        {"b_100x70.png", 100, 70, 96, 64, 4, 6, 6},
                        {"c_320x180.png", 320, 180, 224, 128, 8, 14, 28},
                        {"d_80x48.png", 80, 48, 64, 64, 4, 4, 4},
                        {"e_40x36.png", 40, 36, 96, 64, 4, 6, 6}};
  const ImageProcessorConfig config = ImageProcessorConfig::load(kModel);
  for (const Case& c : cases) {
    RgbImage image = decode_image(read_bytes(kGolden + "/images/" + c.file));
    ASSERT_EQ(image.width, c.width) << c.file;
    ASSERT_EQ(image.height, c.height) << c.file;
    EXPECT_EQ(smart_resize(image.height, image.width, config),
              std::make_pair(c.resized_h, c.resized_w))
        << c.file;
    PreparedImage prepared = prepare_image(image, config);
    EXPECT_EQ(prepared.grid_t, 1) << c.file;
    EXPECT_EQ(prepared.grid_h, c.grid_h) << c.file;
    EXPECT_EQ(prepared.grid_w, c.grid_w) << c.file;
    EXPECT_EQ(prepared.n_tokens(), c.tokens) << c.file;
    EXPECT_EQ(prepared.merged_h() * prepared.merged_w(), c.tokens) << c.file;
    EXPECT_EQ(prepared.pixel_values.size(), size_t(c.grid_h * c.grid_w * 1536)) << c.file;
  }
}

TEST(SmartResize, PixelLimitsTiesAndAspectRatio) {
  // Qwen3.5's shipped budget (65536 .. 16777216): a 1280x720 screenshot is 880 tokens, 720 / 32 =
  // 22.5 rounding to 22.
  const ImageProcessorConfig qwen35 = with_limits(65536, 16777216);
  EXPECT_EQ(smart_resize(720, 1280, qwen35), std::make_pair(int64_t(704), int64_t(1280)));
  EXPECT_EQ(smart_resize(48, 80, with_limits(1, 1 << 30)),
            std::make_pair(int64_t(64), int64_t(64)));
  EXPECT_EQ(smart_resize(80, 48, with_limits(1, 1 << 30)),
            std::make_pair(int64_t(64), int64_t(64)));
  EXPECT_EQ(smart_resize(112, 48, with_limits(1, 1 << 30)),
            std::make_pair(int64_t(128), int64_t(64)));
  // max_pixels: 1000 x 1000 into 102400 pixels scales by sqrt(1e6 / 102400) then floors.
  EXPECT_EQ(smart_resize(1000, 1000, with_limits(1024, 102400)),
            std::make_pair(int64_t(320), int64_t(320)));
  // min_pixels: a tiny image grows until it holds the minimum, then ceils.
  EXPECT_EQ(smart_resize(10, 10, with_limits(4096, 32768)),
            std::make_pair(int64_t(64), int64_t(64)));
  EXPECT_EQ(smart_resize(1, 1, with_limits(4096, 32768)), std::make_pair(int64_t(64), int64_t(64)));
  // Under max_pixels a long strip keeps one row of blocks rather than none.
  EXPECT_EQ(smart_resize(20, 3000, with_limits(1024, 32768)).first, 32);
  // A ratio of exactly 200 is allowed: 10 x 2000 grows to the minimum (sqrt(65536 / 20000) = 1.81).
  EXPECT_EQ(smart_resize(10, 2000, qwen35), std::make_pair(int64_t(32), int64_t(3648)));
  EXPECT_EQ(error_of([&] { smart_resize(10, 2001, qwen35); }),
            "image: 2001x10 has an aspect ratio over 200, which the vision model does not take");
  EXPECT_EQ(error_of([&] { smart_resize(5000, 20, qwen35); }),
            "image: 20x5000 has an aspect ratio over 200, which the vision model does not take");
}

std::vector<float> read_floats(const std::string& path) {
  std::vector<uint8_t> bytes = read_bytes(path);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

// Every golden pixel file: bit for bit without a resize; for resized images the largest
// difference in uint8 levels against PIL's bicubic is printed and bounded.
TEST(PrepareImage, MatchesTheGoldenPixelValues) {
  const json session = json::parse(std::ifstream(kGolden + "/session.json"));
  const ImageProcessorConfig config = ImageProcessorConfig::load(kModel);
  ASSERT_EQ(session["images"].size(), 3u);
  for (const json& golden : session["images"]) {
    const std::string file = golden["file"];
    PreparedImage prepared = prepare_image(decode_image(read_bytes(kGolden + "/" + file)), config);
    EXPECT_EQ(prepared.grid_h, golden["grid_thw"][1].get<int64_t>()) << file;
    EXPECT_EQ(prepared.grid_w, golden["grid_thw"][2].get<int64_t>()) << file;
    EXPECT_EQ(prepared.n_tokens(), golden["n_tokens"].get<int64_t>()) << file;
    const std::vector<float> expected =
        read_floats(kGolden + "/" + golden["pixel_values"].get<std::string>());
    ASSERT_EQ(prepared.pixel_values.size(), expected.size()) << file;
    const bool resized = golden["size_wh"] != golden["resized_wh"];
    double worst_levels = 0;
    size_t differing = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      worst_levels =
          std::max(worst_levels, std::fabs(prepared.pixel_values[i] - expected[i]) * 127.5);
      differing += std::memcmp(&prepared.pixel_values[i], &expected[i], sizeof(float)) != 0;
    }
    std::printf("%s: %zu of %zu values differ from PIL's, by at most %.2f uint8 levels\n",
                file.c_str(), differing, expected.size(), worst_levels);
    if (!resized) {
      EXPECT_EQ(differing, 0u) << file << " needs no resize, so it is bit for bit";
    }
    EXPECT_EQ(differing, 0u) << file << " (PIL's bicubic, reproduced)";
  }
}

TEST(PrepareImage, ContentHashFollowsThePixels) {
  const ImageProcessorConfig config = ImageProcessorConfig::load(kModel);
  RgbImage image = decode_image(read_bytes(kGolden + "/images/c_320x180.png"));
  const uint64_t hash = prepare_image(image, config).content_hash;
  EXPECT_EQ(prepare_image(image, config).content_hash, hash);
  RgbImage changed = image;
  changed.rgb[size_t((100 * image.width + 200) * 3 + 1)] ^= 0x20;  // one pixel's green
  EXPECT_NE(prepare_image(changed, config).content_hash, hash);

  RgbImage small = decode_image(read_bytes(kGolden + "/images/a_64x96.png"));  // no resize
  const uint64_t small_hash = prepare_image(small, config).content_hash;
  small.rgb[0] ^= 1;
  EXPECT_NE(prepare_image(small, config).content_hash, small_hash);
}

TEST(ResizeBicubic, KeepsAFlatImageFlatBothWays) {
  for (auto [w, h] : {std::pair(300, 7), std::pair(7, 300), std::pair(33, 45)}) {
    RgbImage flat{31, 17, {}};
    for (int i = 0; i < 31 * 17; ++i) flat.rgb.insert(flat.rgb.end(), {0, 255, 77});
    RgbImage out = resize_bicubic(flat, w, h);
    ASSERT_EQ(out.width, w);
    ASSERT_EQ(out.height, h);
    for (int64_t i = 0; i < w * h; ++i)
      ASSERT_EQ(std::vector<uint8_t>(out.pixel(i % w, i / w), out.pixel(i % w, i / w) + 3),
                (std::vector<uint8_t>{0, 255, 77}));
  }
}

}  // namespace
}  // namespace ellm
