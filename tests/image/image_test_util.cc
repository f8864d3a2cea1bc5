#include "image/image_test_util.h"

#include <jpeglib.h>
#include <png.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace ellm::test {

namespace {

void on_png_error(png_structp, png_const_charp message) { throw std::runtime_error(message); }
void on_png_warning(png_structp, png_const_charp) {}
void append(png_structp png, png_bytep data, size_t size) {
  auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + size);
}
void flush(png_structp) {}

int channels_of(int color_type) {
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
    case PNG_COLOR_TYPE_PALETTE:
      return 1;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      return 2;
    case PNG_COLOR_TYPE_RGB:
      return 3;
    default:
      return 4;
  }
}

// Samples to the row bytes PNG stores: big-endian 16-bit, or several samples a byte below 8.
std::vector<uint8_t> pack_row(const uint16_t* samples, int count, int bit_depth) {
  std::vector<uint8_t> row;
  if (bit_depth == 16) {
    for (int i = 0; i < count; ++i)
      row.insert(row.end(), {uint8_t(samples[i] >> 8), uint8_t(samples[i])});
  } else if (bit_depth == 8) {
    row.assign(samples, samples + count);
  } else {
    row.assign(size_t((count * bit_depth + 7) / 8), 0);
    for (int i = 0; i < count; ++i)
      row[size_t(i * bit_depth / 8)] |=
          uint8_t(samples[i] << (8 - bit_depth - (i * bit_depth) % 8));
  }
  return row;
}

}  // namespace

std::vector<uint8_t> write_png(const PngSpec& spec) {
  std::vector<uint8_t> out;
  png_structp png =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, on_png_error, on_png_warning);
  png_infop info = png_create_info_struct(png);
  png_set_write_fn(png, &out, append, flush);
  png_set_IHDR(png, info, spec.width, spec.height, spec.bit_depth, spec.color_type,
               spec.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!spec.palette.empty())
    png_set_PLTE(png, info, reinterpret_cast<png_const_colorp>(spec.palette.data()),
                 int(spec.palette.size() / 3));
  if (!spec.transparency.empty() && spec.color_type == PNG_COLOR_TYPE_PALETTE) {
    png_set_tRNS(png, info, spec.transparency.data(), int(spec.transparency.size()), nullptr);
  } else if (!spec.transparency.empty()) {  // grey or RGB: the one sample value that is transparent
    png_color_16 key{};
    key.gray = key.red = key.green = key.blue = spec.transparency[0];
    png_set_tRNS(png, info, nullptr, 0, &key);
  }
  const int per_row = spec.width * channels_of(spec.color_type);
  std::vector<std::vector<uint8_t>> rows;
  std::vector<png_bytep> pointers;
  for (int y = 0; y < spec.height; ++y)
    rows.push_back(pack_row(spec.samples.data() + size_t(y) * per_row, per_row, spec.bit_depth));
  for (auto& row : rows) pointers.push_back(row.data());
  png_set_rows(png, info, pointers.data());
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

std::vector<uint8_t> write_png(const RgbImage& image) {
  PngSpec spec{int(image.width), int(image.height), PNG_COLOR_TYPE_RGB, 8, false, {}, {}, {}};
  spec.samples.assign(image.rgb.begin(), image.rgb.end());
  return write_png(spec);
}

// 320 scans of a grey image: each of the 64 coefficients sent one bit plane at a time (bits 4
// and up first, then bits 3 to 0).
std::vector<jpeg_scan_info> bit_plane_scans() {
  std::vector<jpeg_scan_info> scans;
  for (int coefficient = 0; coefficient < 64; ++coefficient)
    for (int low = 4; low >= 0; --low)
      scans.push_back({1, {0}, coefficient, coefficient, low == 4 ? 0 : low + 1, low});
  return scans;
}

std::vector<uint8_t> write_jpeg(const RgbImage& image, int quality, bool grey, JpegScans scans) {
  jpeg_compress_struct info{};
  jpeg_error_mgr errors{};
  info.err = jpeg_std_error(&errors);
  jpeg_create_compress(&info);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&info, &buffer, &size);
  info.image_width = JDIMENSION(image.width);
  info.image_height = JDIMENSION(image.height);
  info.input_components = 3;
  info.in_color_space = JCS_RGB;
  jpeg_set_defaults(&info);
  if (grey) jpeg_set_colorspace(&info, JCS_GRAYSCALE);
  jpeg_set_quality(&info, quality, TRUE);
  const std::vector<jpeg_scan_info> script = bit_plane_scans();
  if (scans == JpegScans::kProgressive) jpeg_simple_progression(&info);
  if (scans == JpegScans::kHundredsOfScans) {
    info.scan_info = script.data();
    info.num_scans = int(script.size());
  }
  jpeg_start_compress(&info, TRUE);
  while (info.next_scanline < info.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(image.pixel(0, info.next_scanline));
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  std::vector<uint8_t> out(buffer, buffer + size);
  jpeg_destroy_compress(&info);
  std::free(buffer);
  return out;
}

RgbImage pattern_image(int width, int height) {
  RgbImage image{width, height, std::vector<uint8_t>(size_t(width) * height * 3)};
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      uint8_t* p = image.rgb.data() + (size_t(y) * width + x) * 3;
      p[0] = uint8_t(255 * x / std::max(1, width - 1));
      p[1] = uint8_t(255 * y / std::max(1, height - 1));
      p[2] = uint8_t(128 + 100 * std::sin(x / 7.0) * std::cos(y / 9.0));
    }
  return image;
}

}  // namespace ellm::test
