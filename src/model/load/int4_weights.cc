#include "model/load/int4_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "base/error.h"

namespace ellm {
namespace {

// AutoAWQ's GEMM packing: nibble R[j] of a word holds its column j (8 columns per word).
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// One GPTQ or AWQ module's tensors, checked, with the file layout's accessors.
struct Int4Module {
  const TensorInfo *qweight = nullptr, *qzeros = nullptr, *scales = nullptr, *g_idx = nullptr;
  bool awq = false;
  int zero_offset = 0;  // GPTQ v1 files store zero - 1
  int64_t rows = 0, k = 0, groups = 0, group = 0;

  static int32_t word(const TensorInfo* t, int64_t i) {
    int32_t v;
    std::memcpy(&v, t->data + 4 * i, 4);
    return v;
  }
  int code(int64_t i, int64_t o) const {
    if (awq) return (word(qweight, i * (rows / 8) + o / 8) >> (4 * kAwqNibble[o % 8])) & 15;
    return (word(qweight, (i / 8) * rows + o) >> (4 * (i % 8))) & 15;
  }
  int zero(int64_t g, int64_t o) const {
    const int64_t words = (rows + 7) / 8;
    const int nibble = awq ? kAwqNibble[o % 8] : int(o % 8);
    return ((word(qzeros, g * words + o / 8) >> (4 * nibble)) & 15) + zero_offset;
  }
  float scale(int64_t g, int64_t o) const {
    const int64_t i = g * rows + o;
    uint16_t v;
    std::memcpy(&v, scales->data + 2 * i, 2);
    return scales->dtype == Dtype::bf16 ? bf16_to_f32(v) : f16_to_f32(v);
  }
  int64_t group_of(int64_t i) const { return g_idx ? word(g_idx, i) : i / group; }
};

const TensorInfo& int4_tensor(const SafetensorsStore& store, const std::string& name,
                              const std::vector<int64_t>& shape, const char* dtype,
                              const std::string& why) {
  const TensorInfo& t = store.get(name);
  const bool f16_ok = std::string(dtype) == "F16" && t.dtype == Dtype::bf16;
  if (t.dtype_name != dtype && !f16_ok)
    fail(t.file->path(), "tensor '" + name + "' has dtype " + t.dtype_name + ", expected " + dtype);
  if (t.shape != shape)
    fail(t.file->path(), "tensor '" + name + "' has shape " + shape_string(t.shape) +
                             ", expected " + shape_string(shape) + " (" + why + ")");
  return t;
}

Int4Module open_module(const SafetensorsStore& store, const Int4Quantization& q,
                       const std::string& module, int64_t rows, int64_t k) {
  Int4Module m;
  m.awq = q.format == "awq";
  m.zero_offset = q.format == "gptq" ? 1 : 0;
  m.rows = rows;
  m.k = k;
  const std::string what = m.awq ? "AWQ" : "GPTQ";
  const std::string file = store.file_for(module + ".qweight");
  if (q.format.empty())
    fail(file, "tensor '" + module + ".qweight' is 4-bit, but config.json has no GPTQ or AWQ "
               "quantization_config");
  if (m.awq ? rows % 8 : k % 8)
    fail(file, "module '" + module + "' has " + std::to_string(m.awq ? rows : k) + " " +
                   (m.awq ? "outputs" : "inputs") + ", not a multiple of 8 (" + what +
                   " packs 8 per word)");
  const int64_t group = q.group_size > 0 ? q.group_size : k;
  if (k % group)
    fail(file, "module '" + module + "' has " + std::to_string(k) + " inputs, not a multiple of "
               "group_size " + std::to_string(group));
  m.groups = k / group;
  m.group = group;
  const std::string shape_of = std::to_string(rows) + " x " + std::to_string(k) + " " + what +
                               " weight, groups of " + std::to_string(group);
  m.scales = &int4_tensor(store, module + ".scales", {m.groups, rows}, "F16", shape_of);
  m.qzeros = &int4_tensor(store, module + ".qzeros", {m.groups, (rows + 7) / 8}, "I32", shape_of);
  m.qweight = &int4_tensor(store, module + ".qweight",
                           m.awq ? std::vector<int64_t>{k, rows / 8}
                                 : std::vector<int64_t>{k / 8, rows},
                           "I32", shape_of);
  if (!m.awq && store.find(module + ".g_idx")) {
    m.g_idx = &int4_tensor(store, module + ".g_idx", {k}, "I32", shape_of);
    for (int64_t i = 0; i < k; ++i) {
      const int32_t g = Int4Module::word(m.g_idx, i);
      if (g < 0 || g >= m.groups)
        fail(m.g_idx->file->path(), "tensor '" + module + ".g_idx' holds group " +
                                        std::to_string(g) + " at " + std::to_string(i) +
                                        ", outside [0, " + std::to_string(m.groups) + ")");
    }
  }
  return m;
}

void release(const SafetensorsStore& store, const Int4Module& m) {
  for (const TensorInfo* t : {m.qweight, m.qzeros, m.scales, m.g_idx})
    if (t) store.release(*t);
}

// The input order that puts each group's inputs side by side (act-order g_idx), stable within a
// group; empty when they already are (g_idx[i] == i / group).
std::vector<int32_t> grouped_order(const Int4Module& m, const std::string& module) {
  if (!m.g_idx) return {};
  bool in_order = true;
  for (int64_t i = 0; i < m.k && in_order; ++i) in_order = m.group_of(i) == i / m.group;
  if (in_order) return {};
  std::vector<int32_t> order(size_t(m.k));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return m.group_of(a) < m.group_of(b); });
  for (int64_t p = 0; p < m.k; ++p)
    if (m.group_of(order[p]) != p / m.group)
      fail(m.g_idx->file->path(), "tensor '" + module + ".g_idx' does not give every group " +
                                      std::to_string(m.group) + " inputs");
  return order;
}

// Where packed input p's code bytes start in a block (kernels.h: quads of 64 bytes, one column's
// 4 inputs side by side); column c % 16's byte is 4 (c % 16) bytes further.
inline int64_t input_offset(int64_t p) { return p / 4 * 64 + p % 4; }

// unpack_codes when the module's rows are whole blocks of w: each block's 16 code bytes of an
// input made from the words that hold them.
void unpack_whole_blocks(const Int4Module& m, const std::vector<int32_t>& position, int64_t row0,
                         PackedWeights& w) {
  auto nibble = [](uint32_t word, int n) { return uint8_t((word >> (4 * n)) & 15); };
  uint8_t* codes = w.codes.get() + (row0 / kInt4Cols) * w.k * 16;
  const int64_t blocks = m.rows / kInt4Cols;
  if (m.awq) {  // input i, block b: words 4b .. 4b + 3 of qweight row i hold its 32 columns
    for (int64_t i = 0; i < m.k; ++i)
      for (int64_t b = 0; b < blocks; ++b) {
        uint32_t words[4];
        std::memcpy(words, m.qweight->data + 4 * (i * (m.rows / 8) + 4 * b), 16);
        uint8_t* out = codes + b * w.k * 16 + input_offset(position[i]);
        for (int c = 0; c < 16; ++c)
          out[4 * c] = uint8_t(nibble(words[c / 8], kAwqNibble[c % 8]) |
                           nibble(words[2 + c / 8], kAwqNibble[c % 8]) << 4);
      }
    return;
  }
  for (int64_t r = 0; r < m.k / 8; ++r)  // inputs 8r .. 8r + 7, block b: 32 words of row r
    for (int64_t b = 0; b < blocks; ++b) {
      uint32_t words[32];
      std::memcpy(words, m.qweight->data + 4 * (r * m.rows + b * kInt4Cols), sizeof words);
      for (int n = 0; n < 8; ++n) {
        uint8_t* out = codes + b * w.k * 16 + input_offset(position[8 * r + n]);
        for (int c = 0; c < 16; ++c) out[4 * c] = uint8_t(nibble(words[c], n) | nibble(words[c + 16], n) << 4);
      }
    }
}

// The module's codes into rows [row0, row0 + rows) of w (fresh: its codes still zero), input i
// at the position `order` gives it (set_int4_code's layout), a qweight word at a time in file
// order: the 8 codes of a word go to one column and 8 inputs (GPTQ), or to 8 columns side by
// side of one input (AWQ; rows and row0 are multiples of 8 there, so the 8 columns share a
// block and a nibble).
void unpack_codes(const Int4Module& m, const std::vector<int32_t>& order, int64_t row0,
                  PackedWeights& w) {
  std::vector<int32_t> position(size_t(m.k));
  for (int64_t p = 0; p < m.k; ++p) position[order.empty() ? p : order[p]] = int32_t(p);
  auto column = [&](int64_t o, int& shift) {  // the code bytes of row o at packed input 0
    const int64_t j = row0 + o;
    shift = j % kInt4Cols < 16 ? 0 : 4;
    return w.codes.get() + (j / kInt4Cols) * w.k * 16 + j % 16 * 4;
  };
  if (row0 % kInt4Cols == 0 && m.rows % kInt4Cols == 0) return unpack_whole_blocks(m, position, row0, w);
  if (m.awq) {
    for (int64_t i = 0; i < m.k; ++i)
      for (int64_t c = 0; c < m.rows / 8; ++c) {
        const uint32_t word = uint32_t(Int4Module::word(m.qweight, i * (m.rows / 8) + c));
        int shift;
        uint8_t* bytes = column(8 * c, shift) + input_offset(position[i]);
        for (int j = 0; j < 8; ++j) bytes[4 * j] |= uint8_t(((word >> (4 * kAwqNibble[j])) & 15) << shift);
      }
    return;
  }
  for (int64_t r = 0; r < m.k / 8; ++r)
    for (int64_t o = 0; o < m.rows; ++o) {
      const uint32_t word = uint32_t(Int4Module::word(m.qweight, r * m.rows + o));
      int shift;
      uint8_t* bytes = column(o, shift);
      for (int n = 0; n < 8; ++n) bytes[input_offset(position[8 * r + n])] |= uint8_t(((word >> (4 * n)) & 15) << shift);
    }
}

}  // namespace

bool is_int4_module(const SafetensorsStore& store, const std::string& module) {
  return store.find(module + ".qweight") != nullptr;
}

int64_t int4_module_group(const SafetensorsStore& store, const Int4Quantization& q,
                          const std::string& module, int64_t rows, int64_t k) {
  return open_module(store, q, module, rows, k).group;
}

void read_int4_module(const SafetensorsStore& store, const Int4Quantization& q,
                     const std::string& module, int64_t rows, int64_t row0, PackedWeights& w) {
  const Int4Module m = open_module(store, q, module, rows, w.k);
  if (m.group != w.group)
    fail(store.file_for(module + ".qweight"),
         "module '" + module + "' has groups of " + std::to_string(m.group) +
             " inputs, unlike the modules fused with it (" + std::to_string(w.group) + ")");
  const std::vector<int32_t> order = grouped_order(m, module);
  const bool has_order = bool(w.k_order);
  if (row0 == 0 && !order.empty()) {
    w.k_order = make_buffer<int32_t>(order.size());
    std::copy(order.begin(), order.end(), w.k_order.get());
  } else if (order.empty() ? has_order
                           : !has_order || !std::equal(order.begin(), order.end(), w.k_order.get())) {
    fail(m.g_idx ? m.g_idx->file->path() : store.file_for(module + ".qweight"),
         "module '" + module + "' orders its inputs (g_idx) unlike the modules fused with it");
  }
  unpack_codes(m, order, row0, w);
  for (int64_t o = 0; o < rows; ++o) {
    const int64_t j = row0 + o;
    for (int64_t g = 0; g < m.groups; ++g) {
      const float scale = m.scale(g, o);
      if (!std::isfinite(scale))
        fail(m.scales->file->path(), "tensor '" + module + ".scales' holds a non-finite factor "
                                     "at [" + std::to_string(g) + ", " + std::to_string(o) + "]");
      w.scales[int4_group_index(w, j, g)] = scale;
      w.zeros[int4_group_index(w, j, g)] = uint8_t(m.zero(g, o));
    }
  }
  release(store, m);
}

void dequantise_int4_module(const SafetensorsStore& store, const Int4Quantization& q,
                           const std::string& module, int64_t rows, int64_t k, bf16* out) {
  const Int4Module m = open_module(store, q, module, rows, k);
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t i = 0; i < k; ++i) {
      const int64_t g = m.group_of(i);
      out[o * k + i] = f32_to_bf16(m.scale(g, o) * float(m.code(i, o) - m.zero(g, o)));
    }
  release(store, m);
}

int64_t int4_quantise_group(int64_t k) {
  int64_t group = std::min<int64_t>(128, k) / 4 * 4;
  while (k % group) group -= 4;
  return group;
}

void int4_grid(float min, float max, float* scale, uint8_t* zero) {
  min = std::min(min, 0.0f);
  max = std::max(max, 0.0f);
  if (min == max) min = -1, max = 1;  // an all-zero group: any grid holds it
  *scale = (max - min) / 15;
  *zero = uint8_t(std::clamp(std::nearbyint(-min / *scale), 0.0f, 15.0f));
}

void quantise_int4_rows(const float* values, int64_t rows, int64_t row0, PackedWeights& w) {
  const int64_t k = w.k, G = w.group;
  for (int64_t o = 0; o < rows; ++o) {
    const int64_t j = row0 + o;
    const float* row = values + o * k;
    uint8_t* column = w.codes.get() + int4_code_byte(w, j, 0);
    const int shift = j % kInt4Cols < 16 ? 0 : 4;
    for (int64_t g = 0; g < w.groups; ++g) {
      const float* v = row + g * G;
      auto [lo, hi] = std::minmax_element(v, v + G);
      float scale;
      uint8_t zero;
      int4_grid(*lo, *hi, &scale, &zero);
      w.scales[int4_group_index(w, j, g)] = scale;
      w.zeros[int4_group_index(w, j, g)] = zero;
      for (int64_t i = 0; i < G; ++i) {
        const float q = std::nearbyint(v[i] / scale) + float(zero);
        column[input_offset(g * G + i)] |= uint8_t(uint8_t(std::clamp(q, 0.0f, 15.0f)) << shift);
      }
    }
  }
}

}  // namespace ellm
