#pragma once
// Images written at test time with libpng and libjpeg, in the layouts the decoder converts.
#include <cstdint>
#include <vector>

#include "image/decode.h"
#include "test_helpers.h"

namespace ellm::test {

struct PngSpec {
  int width = 0, height = 0;
  int color_type = 2;  // PNG_COLOR_TYPE_*
  int bit_depth = 8;
  bool interlaced = false;
  std::vector<uint16_t> samples;  // one value a sample, rows top to bottom, packed by the writer
  std::vector<uint8_t> palette;   // RGB triples, for palette images
  std::vector<uint8_t>
      transparency;  // tRNS: alpha per palette entry, or the transparent grey/RGB value
};

std::vector<uint8_t> write_png(const PngSpec& spec);
std::vector<uint8_t> write_png(const RgbImage& image);
enum class JpegScans { kBaseline, kProgressive, kHundredsOfScans };
std::vector<uint8_t> write_jpeg(const RgbImage& image, int quality, bool grey = false,
                                JpegScans scans = JpegScans::kBaseline);

// A smooth colour pattern (gradients and waves) that JPEG keeps well.
RgbImage pattern_image(int width, int height);

}  // namespace ellm::test
