// PIL's resampling, written from its description (Pillow's libImaging/Resample.c): separable,
// horizontal pass then vertical, each output pixel a weighted sum of the input pixels under the
// kernel. A downscale stretches the kernel by the scale (antialiasing), the weights of each
// output pixel are normalised to sum to 1, then turned into 22-bit fixed point; the passes
// round and clip to 8 bits, the horizontal one included. Every one of these steps moves pixels
// by a level or more, so all are kept.
#include "image/resize.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ellm {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // 8 bits of result, 2 of headroom for overshoot
constexpr double kSupport = 2.0;            // the bicubic kernel's radius

// Keys' cubic convolution kernel with a = -0.5.
double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// The taps of every output pixel along one axis: the first input index, how many follow, and
// their fixed-point weights (kernel_size a pixel, zero past the count).
struct Taps {
  int kernel_size = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;
};

Taps taps_for(int in_size, int out_size) {
  const double scale = double(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = kSupport * filter_scale;
  const double inverse_scale = 1.0 / filter_scale;  // multiplied, not divided: PIL's rounding
  Taps taps;
  taps.kernel_size = int(std::ceil(support)) * 2 + 1;
  taps.first.resize(size_t(out_size));
  taps.count.resize(size_t(out_size));
  taps.weights.assign(size_t(out_size) * taps.kernel_size, 0);
  std::vector<double> w(size_t(taps.kernel_size));
  for (int out = 0; out < out_size; ++out) {
    const double center = (out + 0.5) * scale;
    // Truncation toward zero on purpose: PIL's bounds round this way.
    const int lo = std::max(int(center - support + 0.5), 0);
    const int hi = std::min(int(center + support + 0.5), in_size);
    const int count = hi - lo;
    double sum = 0.0;
    for (int i = 0; i < count; ++i)
      sum += w[size_t(i)] = bicubic((i + lo - center + 0.5) * inverse_scale);
    int32_t* fixed = &taps.weights[size_t(out) * taps.kernel_size];
    for (int i = 0; i < count; ++i) {
      const double k = (sum != 0.0 ? w[size_t(i)] / sum : w[size_t(i)]) * (1 << kPrecisionBits);
      fixed[i] = int32_t(k < 0 ? k - 0.5 : k + 0.5);
    }
    taps.first[size_t(out)] = lo;
    taps.count[size_t(out)] = count;
  }
  return taps;
}

uint8_t clip8(int32_t sum) {
  return uint8_t(std::clamp(sum >> kPrecisionBits, int32_t(0), int32_t(255)));
}

// One pass: out(o) = sum of in(first + i) x weight(i); `step` is the distance between two
// neighbours along the resized axis in `in`, `stride` between two along the other.
void resample(const uint8_t* in, int64_t step, int64_t in_stride, uint8_t* out, int64_t out_step,
              int64_t out_stride, int64_t lines, const Taps& taps) {
  const int64_t out_size = int64_t(taps.first.size());
  for (int64_t line = 0; line < lines; ++line)
    for (int64_t o = 0; o < out_size; ++o) {
      const int32_t* k = &taps.weights[size_t(o) * taps.kernel_size];
      const uint8_t* src = in + line * in_stride + taps.first[size_t(o)] * step;
      int32_t sum[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1),
                        1 << (kPrecisionBits - 1)};
      for (int i = 0; i < taps.count[size_t(o)]; ++i, src += step)
        for (int c = 0; c < 3; ++c) sum[c] += src[c] * k[i];
      uint8_t* dst = out + line * out_stride + o * out_step;
      for (int c = 0; c < 3; ++c) dst[c] = clip8(sum[c]);
    }
}

}  // namespace

RgbImage resize_bicubic(const RgbImage& image, int64_t width, int64_t height) {
  RgbImage current = image;
  if (width != current.width) {
    RgbImage next{width, current.height, std::vector<uint8_t>(size_t(width * current.height * 3))};
    resample(current.rgb.data(), 3, current.width * 3, next.rgb.data(), 3, width * 3,
             current.height, taps_for(int(current.width), int(width)));
    current = std::move(next);
  }
  if (height != current.height) {
    RgbImage next{width, height, std::vector<uint8_t>(size_t(width * height * 3))};
    resample(current.rgb.data(), width * 3, 3, next.rgb.data(), width * 3, 3, width,
             taps_for(int(current.height), int(height)));
    current = std::move(next);
  }
  return current;
}

}  // namespace ellm
