// JPEG through libjpeg(-turbo), with its default (PIL's) decoding settings: the same library and
// settings give the same pixels as PIL. libjpeg reports errors by longjmp; the frames that set
// the jump hold plain data only, so no C++ destructor is ever jumped over.
#include <csetjmp>
#include <cstddef>
#include <cstdio>
#include <string>

// After <cstdio> and <cstddef>: jpeglib.h uses FILE and size_t without including them.
#include <jerror.h>
#include <jpeglib.h>

#include "base/error.h"
#include "image/decode.h"

namespace ellm {

namespace {

// A progressive JPEG re-reads its whole coefficient buffer on every scan; real encoders write
// about ten, and thousands of tiny scans would make a small file cost minutes.
constexpr int kMaxScans = 256;

struct JpegReader {
  jpeg_decompress_struct info{};
  jpeg_error_mgr errors{};
  jpeg_progress_mgr progress{};
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = "";

  ~JpegReader() { jpeg_destroy_decompress(&info); }
};

JpegReader& reader_of(j_common_ptr info) { return *static_cast<JpegReader*>(info->client_data); }

void on_jpeg_error(j_common_ptr info) {
  JpegReader& reader = reader_of(info);
  info->err->format_message(info, reader.message);
  std::longjmp(reader.jump, 1);
}

// Warnings about damaged data are let through, as PIL lets them; data that ends before the image
// does is an error (libjpeg would fill the rest with grey).
void on_jpeg_message(j_common_ptr info, int level) {
  if (level < 0 && info->err->msg_code == JWRN_JPEG_EOF) on_jpeg_error(info);
}

void on_jpeg_progress(j_common_ptr info) {
  if (reinterpret_cast<j_decompress_ptr>(info)->input_scan_number <= kMaxScans) return;
  JpegReader& reader = reader_of(info);
  std::snprintf(reader.message, sizeof reader.message, "more than %d progressive scans", kMaxScans);
  std::longjmp(reader.jump, 1);
}

bool read_jpeg_header(JpegReader& reader, std::span<const uint8_t> bytes) {
  if (setjmp(reader.jump)) return false;
  jpeg_create_decompress(&reader.info);
  reader.info.progress = &reader.progress;  // after create, which clears the struct
  jpeg_mem_src(&reader.info, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&reader.info, TRUE);
  return true;
}

bool read_jpeg_pixels(JpegReader& reader, uint8_t* out, size_t row_bytes) {
  if (setjmp(reader.jump)) return false;
  jpeg_decompress_struct& info = reader.info;
  info.out_color_space = JCS_RGB;
  jpeg_start_decompress(&info);
  if (info.output_components != 3 || size_t(info.output_width) * 3 != row_bytes)
    ERREXIT(&info, JERR_CONVERSION_NOTIMPL);
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = out + size_t(info.output_scanline) * row_bytes;
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_finish_decompress(&info);
  return true;
}

}  // namespace

RgbImage decode_jpeg(std::span<const uint8_t> bytes, int64_t max_pixels) {
  JpegReader reader;
  reader.info.err = jpeg_std_error(&reader.errors);
  reader.info.client_data = &reader;
  reader.errors.error_exit = on_jpeg_error;
  reader.errors.emit_message = on_jpeg_message;
  reader.progress.progress_monitor = on_jpeg_progress;
  if (!read_jpeg_header(reader, bytes))
    fail("image", std::string("corrupt JPEG: ") + reader.message);
  J_COLOR_SPACE space = reader.info.jpeg_color_space;
  if (space != JCS_GRAYSCALE && space != JCS_YCbCr && space != JCS_RGB)
    fail("image", "JPEG in CMYK or YCCK colour is not supported (send RGB or grey)");

  RgbImage image;
  image.width = reader.info.image_width;
  image.height = reader.info.image_height;
  check_image_size(image.width, image.height, max_pixels, "JPEG");
  image.rgb.resize(size_t(image.width * image.height * 3));
  if (!read_jpeg_pixels(reader, image.rgb.data(), size_t(image.width * 3)))
    fail("image", std::string("corrupt JPEG: ") + reader.message);
  return image;
}

}  // namespace ellm
