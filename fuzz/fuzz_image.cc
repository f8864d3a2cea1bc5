// Fuzzes the image decoders (PNG, JPEG, the format sniffing) and the data URI parser: arbitrary
// bytes must give an image or a clean Error, never a crash, a hang or a huge allocation.
#include <cstdint>
#include <string_view>

#include "base/error.h"
#include "image/decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // 4 Mpx keeps every run's memory small; the size check itself is the same at any limit.
  constexpr int64_t kMaxPixels = int64_t(4) << 20;
  try {
    ellm::RgbImage image = ellm::decode_image({data, size}, kMaxPixels);
    if (image.rgb.size() != size_t(image.width * image.height * 3)) __builtin_trap();
  } catch (const ellm::Error&) {
  }
  try {
    ellm::decode_data_uri(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const ellm::Error&) {
  }
  return 0;
}
