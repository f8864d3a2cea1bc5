#include "tools/int4_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kernels.h"

namespace ellm {
namespace {

constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // nibble n of a word holds column 8c + this

}  // namespace

float Int4Grid::value(int64_t o, int64_t i) const {
  const int64_t g = (i / group) * rows + o;
  return f16_to_f32(scales[g]) * float(int(codes[o * k + i]) - int(zeros[g]));
}

Int4Grid quantise_int4_grid(const std::vector<float>& values, int64_t rows, int64_t k,
                            int64_t group, const std::string& format) {
  Int4Grid m;
  m.rows = rows, m.k = k, m.group = group;
  m.codes.resize(size_t(rows * k));
  m.scales.resize(size_t(k / group * rows));
  m.zeros.resize(m.scales.size());
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t g = 0; g < k / group; ++g) {
      const float* v = values.data() + o * k + g * group;
      auto [lo, hi] = std::minmax_element(v, v + group);
      float scale, zero;
      if (format == "awq") {
        scale = f16_to_f32(f32_to_f16(std::max((*hi - *lo) / 15, 1e-5f)));
        zero = std::clamp(-std::nearbyint(*lo / scale), 0.0f, 15.0f);
      } else {
        scale = f16_to_f32(f32_to_f16(std::max(2 * std::max(-*lo, *hi) / 15, 1e-5f)));
        zero = 8;
      }
      m.scales[g * rows + o] = f32_to_f16(scale);
      m.zeros[g * rows + o] = uint8_t(zero);
      for (int64_t i = 0; i < group; ++i)
        m.codes[o * k + g * group + i] =
            uint8_t(std::clamp(std::nearbyint(v[i] / scale) + zero, 0.0f, 15.0f));
    }
  return m;
}

std::vector<TensorSpec> int4_module_tensors(const TensorSpec& weight, const std::string& format,
                                            int64_t group) {
  const std::string module = weight.name.substr(0, weight.name.size() - 7);  // less ".weight"
  const int64_t rows = weight.shape[0], k = weight.shape[1], groups = k / group;
  const bool awq = format == "awq";
  std::vector<TensorSpec> out = {
      {module + ".qweight", awq ? std::vector<int64_t>{k, rows / 8} : std::vector<int64_t>{k / 8, rows}, "I32"},
      {module + ".qzeros", {groups, (rows + 7) / 8}, "I32"},
      {module + ".scales", {groups, rows}, "F16"}};
  if (!awq) out.push_back({module + ".g_idx", {k}, "I32"});
  return out;
}

void int4_tensor_bytes(const Int4Grid& m, const std::string& format, const std::string& name,
                       int64_t first, int64_t count, uint8_t* out) {
  const bool awq = format == "awq";
  const int64_t rows = m.rows, k = m.k, words_per_row = (rows + 7) / 8;
  auto put = [&](int64_t i, uint32_t word) { std::memcpy(out + 4 * (i - first), &word, 4); };
  for (int64_t e = first; e < first + count; ++e) {
    if (name.ends_with(".qweight")) {
      uint32_t word = 0;
      for (int n = 0; n < 8; ++n) {
        const uint32_t q = awq ? m.codes[(e % (rows / 8) * 8 + kAwqOrder[n]) * k + e / (rows / 8)]
                               : m.codes[(e % rows) * k + (e / rows) * 8 + n];
        word |= q << (4 * n);
      }
      put(e, word);
    } else if (name.ends_with(".qzeros")) {
      const int64_t g = e / words_per_row, c = e % words_per_row;
      uint32_t word = 0;
      for (int n = 0; n < 8; ++n) {
        const int64_t o = c * 8 + (awq ? kAwqOrder[n] : n);
        if (o >= rows) continue;
        const uint32_t zero = m.zeros[g * rows + o] - (format == "gptq" ? 1 : 0);
        word |= (zero & 15) << (4 * n);
      }
      put(e, word);
    } else if (name.ends_with(".scales")) {
      std::memcpy(out + 2 * (e - first), &m.scales[size_t(e)], 2);
    } else {  // g_idx
      put(e, uint32_t(e / m.group));
    }
  }
}

}  // namespace ellm
