#include "image/decode.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>

#include "base/base64.h"
#include "base/error.h"

namespace ellm {

namespace {

using namespace std::string_view_literals;

bool starts_with(std::span<const uint8_t> bytes, std::string_view magic, size_t at = 0) {
  return bytes.size() >= at + magic.size() &&
         std::memcmp(bytes.data() + at, magic.data(), magic.size()) == 0;
}

// Formats that are recognised but not decoded, named so the client knows what to convert.
const char* unsupported_format(std::span<const uint8_t> bytes) {
  if (starts_with(bytes, "GIF87a") || starts_with(bytes, "GIF89a")) return "GIF";
  if (starts_with(bytes, "RIFF") && starts_with(bytes, "WEBP", 8)) return "WebP";
  if (starts_with(bytes, "BM")) return "BMP";
  if (starts_with(bytes, "II*\0"sv) || starts_with(bytes, "MM\0*"sv)) return "TIFF";
  if (starts_with(bytes, "ftypavif", 4) || starts_with(bytes, "ftypheic", 4)) return "AVIF/HEIC";
  return nullptr;
}

}  // namespace

void check_image_size(int64_t width, int64_t height, int64_t max_pixels, const char* format) {
  if (width <= 0 || height <= 0)
    fail("image", std::string(format) + " has an empty size (" + std::to_string(width) + "x" +
                      std::to_string(height) + ")");
  if (width > max_pixels / height)
    fail("image", std::string(format) + " is " + std::to_string(width) + "x" +
                      std::to_string(height) + " pixels, over the limit of " +
                      std::to_string(max_pixels) + " pixels");
}

std::vector<uint8_t> decode_data_uri(std::string_view uri) {
  constexpr std::string_view kScheme = "data:";
  if (uri.size() < kScheme.size() ||
      !std::equal(kScheme.begin(), kScheme.end(), uri.begin(),
                  [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); }))
    fail("image data URI", "does not start with 'data:'");
  size_t comma = uri.find(',');
  if (comma == std::string_view::npos) fail("image data URI", "has no ',' before its data");
  std::string_view header = uri.substr(kScheme.size(), comma - kScheme.size());
  if (header.size() < 7 || header.substr(header.size() - 7) != ";base64")
    fail("image data URI", "only base64 data is supported (';base64,' is missing)");
  std::string_view media_type = header.substr(0, header.find(';'));
  if (!media_type.empty() && !media_type.starts_with("image/"))
    fail("image data URI", "media type '" + std::string(media_type) + "' is not an image");
  std::optional<std::string> bytes = base64_decode(uri.substr(comma + 1));
  if (!bytes) fail("image data URI", "its data is not valid base64");
  if (bytes->empty()) fail("image data URI", "its data is empty");
  return std::vector<uint8_t>(bytes->begin(), bytes->end());
}

RgbImage decode_image(std::span<const uint8_t> bytes, int64_t max_pixels) {
  if (bytes.empty()) fail("image", "no data");
  if (starts_with(bytes, "\x89PNG\r\n\x1a\n")) return decode_png(bytes, max_pixels);
  if (starts_with(bytes, "\xff\xd8\xff")) return decode_jpeg(bytes, max_pixels);
  if (const char* format = unsupported_format(bytes))
    fail("image", std::string(format) + " is not supported (send PNG or JPEG)");
  fail("image", "unknown format (PNG and JPEG are supported)");
}

}  // namespace ellm
