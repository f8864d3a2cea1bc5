// PNG through libpng's sequential reader. libpng reports errors by longjmp; the frames that
// set the jump hold plain data only, so no C++ destructor is ever jumped over.
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>

#include "base/error.h"
#include "image/decode.h"

namespace ellm {

namespace {

struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0, at = 0;
  char message[200] = "";

  ~PngReader() { png_destroy_read_struct(&png, &info, nullptr); }
};

void on_png_error(png_structp png, png_const_charp message) {
  auto* reader = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(reader->message, sizeof reader->message, "%s", message);
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {}

void on_png_read(png_structp png, png_bytep out, size_t bytes) {
  auto* reader = static_cast<PngReader*>(png_get_io_ptr(png));
  if (reader->size - reader->at < bytes) png_error(png, "the data ends early (truncated)");
  std::memcpy(out, reader->data + reader->at, bytes);
  reader->at += bytes;
}

bool read_png_header(PngReader& reader) {
  if (setjmp(png_jmpbuf(reader.png))) return false;
  png_set_read_fn(reader.png, &reader, on_png_read);
  png_read_info(reader.png, reader.info);
  return true;
}

// Every layout to 8-bit RGB: palette and low-bit grey expanded, 16 bits cut to their high byte
// (PIL's unpacking of 16-bit RGB), alpha and tRNS transparency dropped, grey copied to R, G, B.
bool read_png_pixels(PngReader& reader, png_bytepp rows, size_t row_bytes) {
  if (setjmp(png_jmpbuf(reader.png))) return false;
  png_structp png = reader.png;
  int color_type = png_get_color_type(png, reader.info);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, reader.info) < 8)
    png_set_expand_gray_1_2_4_to_8(png);
  if (png_get_bit_depth(png, reader.info) == 16) png_set_strip_16(png);
  // Expanding a palette expands its tRNS transparency into alpha too.
  if ((color_type & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, reader.info, PNG_INFO_tRNS))
    png_set_strip_alpha(png);
  if (!(color_type & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, reader.info);
  if (png_get_rowbytes(png, reader.info) != row_bytes || png_get_channels(png, reader.info) != 3 ||
      png_get_bit_depth(png, reader.info) != 8)
    png_error(png, "this layout does not convert to 8-bit RGB");
  png_read_image(png, rows);
  return true;
}

}  // namespace

RgbImage decode_png(std::span<const uint8_t> bytes, int64_t max_pixels) {
  PngReader reader;
  reader.data = bytes.data();
  reader.size = bytes.size();
  reader.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, on_png_error, on_png_warning);
  if (!reader.png) fail("image", "PNG: out of memory");
  reader.info = png_create_info_struct(reader.png);
  if (!reader.info) fail("image", "PNG: out of memory");
  if (!read_png_header(reader)) fail("image", std::string("corrupt PNG: ") + reader.message);

  RgbImage image;
  image.width = png_get_image_width(reader.png, reader.info);
  image.height = png_get_image_height(reader.png, reader.info);
  check_image_size(image.width, image.height, max_pixels, "PNG");
  image.rgb.resize(size_t(image.width * image.height * 3));
  std::vector<png_bytep> rows(size_t(image.height));
  for (int64_t y = 0; y < image.height; ++y)
    rows[size_t(y)] = image.rgb.data() + y * image.width * 3;
  if (!read_png_pixels(reader, rows.data(), size_t(image.width * 3)))
    fail("image", std::string("corrupt PNG: ") + reader.message);
  return image;
}

}  // namespace ellm
