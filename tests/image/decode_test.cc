#include "image/decode.h"

#include <gtest/gtest.h>
#include <png.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "base/base64.h"
#include "base/error.h"
#include "image/image_test_util.h"

namespace ellm {
namespace {

using test::error_of;
using test::PngSpec;

TEST(DecodePng, Rgb8IsExact) {
  RgbImage image = test::pattern_image(37, 23);
  RgbImage decoded = decode_image(test::write_png(image));
  EXPECT_EQ(decoded.width, 37);
  EXPECT_EQ(decoded.height, 23);
  EXPECT_EQ(decoded.rgb, image.rgb);
}

using Bytes = std::vector<uint8_t>;

PngSpec png_spec(int width, int height, int color_type, int bit_depth,
                 std::vector<uint16_t> samples) {
  PngSpec spec;
  spec.width = width, spec.height = height;
  spec.color_type = color_type, spec.bit_depth = bit_depth;
  spec.samples = std::move(samples);
  return spec;
}

// The RGB bytes decoded from a PNG written as `spec` says.
Bytes rgb_of(const PngSpec& spec) { return decode_image(test::write_png(spec)).rgb; }

TEST(DecodePng, InterlacedGivesTheSamePixels) {
  RgbImage image = test::pattern_image(19, 13);
  PngSpec spec = png_spec(19, 13, PNG_COLOR_TYPE_RGB, 8, {image.rgb.begin(), image.rgb.end()});
  spec.interlaced = true;
  EXPECT_EQ(rgb_of(spec), image.rgb);
}

TEST(DecodePng, GreyBecomesEqualChannels) {
  EXPECT_EQ(rgb_of(png_spec(3, 1, PNG_COLOR_TYPE_GRAY, 8, {0, 17, 255})),
            (Bytes{0, 0, 0, 17, 17, 17, 255, 255, 255}));
}

TEST(DecodePng, LowBitGreyIsScaledToTheFullRange) {
  EXPECT_EQ(rgb_of(png_spec(4, 1, PNG_COLOR_TYPE_GRAY, 2, {0, 1, 2, 3})),
            (Bytes{0, 0, 0, 85, 85, 85, 170, 170, 170, 255, 255, 255}));
  EXPECT_EQ(rgb_of(png_spec(3, 1, PNG_COLOR_TYPE_GRAY, 1, {1, 0, 1})),
            (Bytes{255, 255, 255, 0, 0, 0, 255, 255, 255}));
}

TEST(DecodePng, PaletteBecomesItsColoursAndTransparencyIsDropped) {
  for (int depth : {8, 4}) {
    PngSpec spec = png_spec(4, 1, PNG_COLOR_TYPE_PALETTE, depth, {2, 0, 1, 2});
    spec.palette = {10, 20, 30, 200, 100, 50, 1, 2, 3};
    spec.transparency = {0, 128};
    EXPECT_EQ(rgb_of(spec), (Bytes{1, 2, 3, 10, 20, 30, 200, 100, 50, 1, 2, 3}))
        << depth << "-bit palette";
  }
}

TEST(DecodePng, AlphaIsDroppedNotBlended) {
  EXPECT_EQ(rgb_of(png_spec(2, 1, PNG_COLOR_TYPE_RGB_ALPHA, 8, {10, 20, 30, 0, 250, 240, 230, 77})),
            (Bytes{10, 20, 30, 250, 240, 230}));
  EXPECT_EQ(rgb_of(png_spec(2, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 8, {90, 0, 160, 255})),
            (Bytes{90, 90, 90, 160, 160, 160}));
  PngSpec grey_key = png_spec(4, 1, PNG_COLOR_TYPE_GRAY, 2, {0, 1, 2, 3});
  grey_key.transparency = {1};
  EXPECT_EQ(rgb_of(grey_key), (Bytes{0, 0, 0, 85, 85, 85, 170, 170, 170, 255, 255, 255}));
  PngSpec rgb_key = png_spec(2, 1, PNG_COLOR_TYPE_RGB, 8, {10, 10, 10, 9, 10, 11});
  rgb_key.transparency = {10};
  EXPECT_EQ(rgb_of(rgb_key), (Bytes{10, 10, 10, 9, 10, 11}));
}

TEST(DecodePng, SixteenBitKeepsTheHighByte) {
  EXPECT_EQ(rgb_of(png_spec(2, 1, PNG_COLOR_TYPE_RGB, 16,
                            {0x1234, 0xffff, 0x00ff, 0x8000, 0x80ff, 0x0100})),
            (Bytes{0x12, 0xff, 0x00, 0x80, 0x80, 0x01}));
  EXPECT_EQ(rgb_of(png_spec(1, 1, PNG_COLOR_TYPE_GRAY, 16, {0xabcd})), (Bytes{0xab, 0xab, 0xab}));
  EXPECT_EQ(rgb_of(png_spec(1, 1, PNG_COLOR_TYPE_RGB_ALPHA, 16, {0x0102, 0x0304, 0x0506, 0})),
            (Bytes{1, 3, 5}));
}

TEST(DecodeJpeg, ColourAndGreyWithinJpegLoss) {
  RgbImage image = test::pattern_image(64, 48);
  for (bool grey : {false, true}) {
    RgbImage decoded = decode_image(test::write_jpeg(image, 95, grey));
    ASSERT_EQ(decoded.width, 64);
    ASSERT_EQ(decoded.height, 48);
    int worst = 0;
    double total = 0;
    for (size_t p = 0; p < decoded.rgb.size() / 3; ++p) {
      const uint8_t* in = image.rgb.data() + p * 3;
      const uint8_t* out = decoded.rgb.data() + p * 3;
      // A grey JPEG holds the luma (BT.601 weights) in all three channels.
      const int luma = int(std::lround(0.299 * in[0] + 0.587 * in[1] + 0.114 * in[2]));
      for (int c = 0; c < 3; ++c) {
        const int diff = std::abs(int(out[c]) - (grey ? luma : int(in[c])));
        worst = std::max(worst, diff);
        total += diff;
      }
      if (grey) {
        EXPECT_TRUE(out[0] == out[1] && out[1] == out[2]);
      }
    }
    const double mean = total / double(decoded.rgb.size());
    std::printf("JPEG q95 %s: max %d levels, mean %.2f\n", grey ? "grey" : "colour", worst, mean);
    EXPECT_LE(worst, grey ? 4 : 16);
    EXPECT_LE(mean, 2.0);
  }
}

TEST(DecodeJpeg, ProgressiveDecodesAndEndlessScansAreRefused) {
  RgbImage image = test::pattern_image(32, 24);
  RgbImage baseline = decode_image(test::write_jpeg(image, 90));
  RgbImage progressive =
      decode_image(test::write_jpeg(image, 90, false, test::JpegScans::kProgressive));
  EXPECT_EQ(progressive.rgb, baseline.rgb);  // the same coefficients, sent in another order
  EXPECT_EQ(error_of([&] {
              decode_image(test::write_jpeg(image, 90, true, test::JpegScans::kHundredsOfScans));
            }),
            "image: corrupt JPEG: more than 256 progressive scans");
}

TEST(DataUri, GoodUrisGiveTheirBytes) {
  std::vector<uint8_t> png = test::write_png(test::pattern_image(5, 4));
  std::string b64 = base64_encode(std::string(png.begin(), png.end()));
  EXPECT_EQ(decode_data_uri("data:image/png;base64," + b64), png);
  EXPECT_EQ(decode_data_uri("DATA:image/jpeg;base64," + b64), png);
  EXPECT_EQ(decode_data_uri("data:;base64," + b64), png);
  std::string wrapped = b64.substr(0, 20) + "\r\n" + b64.substr(20);
  EXPECT_EQ(decode_data_uri("data:image/png;base64," + wrapped), png);
  EXPECT_EQ(decode_image(decode_data_uri("data:image/png;base64," + b64)).width, 5);
}

TEST(DataUri, BadUrisGiveClearErrors) {
  auto error = [](std::string uri) { return error_of([&] { decode_data_uri(uri); }); };
  EXPECT_EQ(error("https://example.com/a.png"), "image data URI: does not start with 'data:'");
  EXPECT_EQ(error("data:image/png;base64"), "image data URI: has no ',' before its data");
  EXPECT_EQ(error("data:image/png,%89PNG"),
            "image data URI: only base64 data is supported (';base64,' is missing)");
  EXPECT_EQ(error("data:text/plain;base64,aGVsbG8="),
            "image data URI: media type 'text/plain' is not an image");
  EXPECT_EQ(error("data:image/png;base64,iVBO*w0K"),
            "image data URI: its data is not valid base64");
  EXPECT_EQ(error("data:image/png;base64,iVBORw0K="),
            "image data URI: its data is not valid base64");
  EXPECT_EQ(error("data:image/png;base64,iVBORw0Kx"),
            "image data URI: its data is not valid base64");
  EXPECT_EQ(error("data:image/png;base64,QQ==QQ=="),
            "image data URI: its data is not valid base64");
  EXPECT_EQ(error("data:image/png;base64,"), "image data URI: its data is empty");
}

TEST(DecodeImage, EmptyUnknownAndUnsupportedFormats) {
  auto error = [](std::string bytes) {
    return error_of([&] { decode_image(std::vector<uint8_t>(bytes.begin(), bytes.end())); });
  };
  EXPECT_EQ(error(""), "image: no data");
  EXPECT_EQ(error("GIF89a\x01\x00\x01\x00"), "image: GIF is not supported (send PNG or JPEG)");
  EXPECT_EQ(error(std::string("RIFF\0\0\0\0WEBPVP8 ", 16)),
            "image: WebP is not supported (send PNG or JPEG)");
  EXPECT_EQ(error("hello, world"), "image: unknown format (PNG and JPEG are supported)");
}

// Where the SOF0 marker (frame header: length, precision, height, width) starts.
size_t sof0_at(const std::vector<uint8_t>& jpeg) {
  for (size_t i = 2; i + 8 < jpeg.size(); ++i)
    if (jpeg[i] == 0xff && jpeg[i + 1] == 0xc0) return i;
  ADD_FAILURE() << "no SOF0 marker";
  return 0;
}

TEST(DecodeImage, TruncatedAndCorruptDataAreErrors) {
  std::vector<uint8_t> png = test::write_png(test::pattern_image(40, 30));
  std::vector<uint8_t> jpeg = test::write_jpeg(test::pattern_image(40, 30), 90);
  for (size_t keep : {size_t(8), size_t(20), size_t(33), png.size() / 2, png.size() - 13}) {
    std::string message = error_of([&] { decode_image(std::span(png).first(keep)); });
    EXPECT_TRUE(message.starts_with("image: corrupt PNG: ")) << keep << ": " << message;
  }
  for (size_t keep : {size_t(3), size_t(40), jpeg.size() / 2, jpeg.size() - 2}) {
    std::string message = error_of([&] { decode_image(std::span(jpeg).first(keep)); });
    EXPECT_TRUE(message.starts_with("image: corrupt JPEG: ")) << keep << ": " << message;
  }
  std::vector<uint8_t> bad_crc = png;
  bad_crc[20] ^= 0x40;  // inside IHDR, whose CRC then fails
  EXPECT_TRUE(error_of([&] { decode_image(bad_crc); }).starts_with("image: corrupt PNG: "));
  std::vector<uint8_t> bad_jpeg = jpeg;
  bad_jpeg[sof0_at(jpeg) + 4] = 7;  // a sample precision that does not exist
  EXPECT_EQ(error_of([&] { decode_image(bad_jpeg); }),
            "image: corrupt JPEG: Unsupported JPEG data precision 7");
}

// A PNG signature, an IHDR chunk that claims `width` x `height` (its CRC right), and the start of
// an IDAT chunk whose data never comes.
std::vector<uint8_t> png_header_only(uint32_t width, uint32_t height) {
  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n',
                              0,    0,   0,   13,  'I',  'H',  'D',  'R'};
  for (uint32_t v : {width, height})
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(uint8_t(v >> shift));
  out.insert(out.end(), {8, 2, 0, 0, 0});
  uint32_t crc = 0xffffffffu;
  for (size_t i = 12; i < out.size(); ++i) {
    crc ^= out[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1)));
  }
  crc ^= 0xffffffffu;
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(uint8_t(crc >> shift));
  out.insert(out.end(), {0, 0, 0x10, 0, 'I', 'D', 'A', 'T'});
  return out;
}

TEST(DecodeImage, OversizeImagesAreRefusedBeforeDecoding) {
  // 300000 x 300000 (90 Gpx): refused from the header, nothing allocated.
  EXPECT_EQ(error_of([] { decode_image(png_header_only(300000, 300000)); }),
            "image: PNG is 300000x300000 pixels, over the limit of 67108864 pixels");
  EXPECT_TRUE(
      error_of([] { decode_image(png_header_only(64, 64)); }).starts_with("image: corrupt PNG"));

  std::vector<uint8_t> jpeg = test::write_jpeg(test::pattern_image(16, 16), 90);
  const size_t sof = sof0_at(jpeg);
  jpeg[sof + 5] = 0xea, jpeg[sof + 6] = 0x60, jpeg[sof + 7] = 0xea, jpeg[sof + 8] = 0x60;
  EXPECT_EQ(error_of([&] { decode_image(jpeg); }),
            "image: JPEG is 60000x60000 pixels, over the limit of 67108864 pixels");

  EXPECT_EQ(error_of([] { decode_image(test::write_png(test::pattern_image(40, 30)), 1000); }),
            "image: PNG is 40x30 pixels, over the limit of 1000 pixels");
  EXPECT_EQ(decode_image(test::write_png(test::pattern_image(40, 25)), 1000).width, 40);
}

}  // namespace
}  // namespace ellm
