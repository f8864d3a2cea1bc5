#pragma once
// Image bytes to 8-bit RGB pixels: PNG and JPEG (told apart by their magic bytes), and the
// data URIs that carry them in API requests. Every failure is an Error with a one-line message
// fit for a client (HTTP 400): corrupt, truncated, unknown format, too large.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace ellm {

struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes a pixel

  const uint8_t* pixel(int64_t x, int64_t y) const { return rgb.data() + (y * width + x) * 3; }
};

// Refused before any pixel buffer is allocated, so a small file that claims a huge image (a
// decompression bomb) costs nothing: 64 Mpx, past any screen, is 192 MiB of RGB.
constexpr int64_t kMaxDecodedPixels = int64_t(64) << 20;

// "data:image/png;base64,...." -> the bytes. Only base64 URIs of an image/* type (or of none).
std::vector<uint8_t> decode_data_uri(std::string_view uri);

// Grey, palette, alpha and 16-bit images all become 8-bit RGB. Alpha is dropped, not blended,
// as PIL's convert("RGB") (what transformers' processor does) drops it; 16-bit samples keep
// their high byte.
RgbImage decode_image(std::span<const uint8_t> bytes, int64_t max_pixels = kMaxDecodedPixels);

// The format decoders behind decode_image (png_decode.cc, jpeg_decode.cc).
RgbImage decode_png(std::span<const uint8_t> bytes, int64_t max_pixels);
RgbImage decode_jpeg(std::span<const uint8_t> bytes, int64_t max_pixels);

// Throws unless width x height is a positive size within max_pixels.
void check_image_size(int64_t width, int64_t height, int64_t max_pixels, const char* format);

}  // namespace ellm
