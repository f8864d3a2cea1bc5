#include "model/load/tensor_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "model/load/int4_weights.h"

namespace ellm {
namespace {

float element_f32(const TensorInfo& t, int64_t i) {
  switch (t.dtype) {
    case Dtype::bf16: {
      bf16 v;
      std::memcpy(&v, t.data + 2 * i, 2);
      return bf16_to_f32(v);
    }
    case Dtype::f16: {
      uint16_t v;
      std::memcpy(&v, t.data + 2 * i, 2);
      return f16_to_f32(v);
    }
    case Dtype::f32: {
      float v;
      std::memcpy(&v, t.data + 4 * i, 4);
      return v;
    }
    case Dtype::f8_e4m3:  // needs its factors: see Loader::fp8_factors
    case Dtype::other: break;
  }
  return 0;
}

// The bytes of every tensor a load reads: all but those under the skipped prefixes, and one
// tensor twice.
size_t bytes_to_read(const SafetensorsStore& store, const std::vector<std::string>& skipped,
                     const std::string& read_twice) {
  const TensorInfo* twice = read_twice.empty() ? nullptr : store.find(read_twice);
  size_t total = twice ? twice->bytes : 0;
  for (const auto& [name, t] : store.tensors()) {
    bool skip = false;
    for (const std::string& prefix : skipped) skip = skip || name.rfind(prefix, 0) == 0;
    if (!skip) total += t.bytes;
  }
  return total;
}

size_t bytes_under(const SafetensorsStore& store, const std::string& prefix) {
  size_t total = 0;
  for (const auto& [name, t] : store.tensors())
    if (name.rfind(prefix, 0) == 0) total += t.bytes;
  return total;
}

std::string scale_name(const std::string& weight) { return weight + "_scale_inv"; }

}  // namespace

TensorLoader::TensorLoader(const SafetensorsStore& store, const Int4Quantization& int4, Isa isa,
                           bool quantize_fp8, bool quantize_int4, bool quantize_lm_head,
                           const std::vector<std::string>& skipped_prefixes,
                           const std::string& read_twice)
    : store_(store), isa_(isa), quantize_fp8_(quantize_fp8), quantize_int4_(quantize_int4),
      quantize_lm_head_(quantize_lm_head), int4_(int4),
      progress_("loading weights (MiB)", (bytes_to_read(store, skipped_prefixes, read_twice) >> 20) + 1) {}

TensorLoader::TensorLoader(const SafetensorsStore& store, Isa isa, const std::string& prefix,
                           const std::string& label)
    : store_(store), isa_(isa), quantize_fp8_(false), quantize_int4_(false),
      quantize_lm_head_(false), progress_(label, (bytes_under(store, prefix) >> 20) + 1) {}

// The tensor `name`, checked to have exactly `shape` and a float dtype (F8_E4M3 only where
// allow_fp8: linear weights).
const TensorInfo& TensorLoader::tensor(const std::string& name, const std::vector<int64_t>& shape,
                         bool allow_fp8) {
  const TensorInfo& t = store_.get(name);
  const std::string& file = t.file->path();
  if (t.dtype == Dtype::other)
    fail(file, "tensor '" + name + "' has dtype " + t.dtype_name + ", expected BF16, F16" +
                   (allow_fp8 ? ", F32 or F8_E4M3" : " or F32"));
  if (t.dtype == Dtype::f8_e4m3 && !allow_fp8)
    fail(file, "tensor '" + name + "' is F8_E4M3, but only linear weights may be FP8");
  if (t.shape != shape)
    fail(file, "tensor '" + name + "' has shape " + shape_string(t.shape) + ", expected " +
                   shape_string(shape) + " from config.json");
  return t;
}

void TensorLoader::done(const TensorInfo& t) {
  store_.release(t);
  show_progress();
}

void TensorLoader::show_progress() {
  progress_.update((store_.released_bytes() + kept_mapped_) >> 20);
}

Buffer<float> TensorLoader::vector_f32(const std::string& name, int64_t n) {
  const TensorInfo& t = tensor(name, {n});
  Buffer<float> out = make_buffer<float>(size_t(n));
  for (int64_t i = 0; i < n; ++i) out[i] = element_f32(t, i);
  bytes_ += size_t(n) * sizeof(float);
  done(t);
  return out;
}

// A (1 + w) RMSNorm weight (Qwen3.5), as the weight the kernels multiply by.
Buffer<float> TensorLoader::vector_f32_plus_one(const std::string& name, int64_t n) {
  Buffer<float> out = vector_f32(name, n);
  for (int64_t i = 0; i < n; ++i) out[i] += 1.0f;
  return out;
}

// conv1d.weight [channels][1][taps] as [taps][channels].
Buffer<float> TensorLoader::conv_weight(const std::string& name, int64_t channels, int64_t taps) {
  const TensorInfo& t = tensor(name, {channels, 1, taps});
  Buffer<float> out = make_buffer<float>(size_t(channels * taps));
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t j = 0; j < taps; ++j) out[j * channels + c] = element_f32(t, c * taps + j);
  bytes_ += size_t(channels * taps) * sizeof(float);
  done(t);
  return out;
}

Buffer<float> TensorLoader::matrix_f32(const std::string& name, int64_t rows, int64_t cols) {
  const TensorInfo& t = tensor(name, {rows, cols}, /*allow_fp8=*/true);
  Buffer<float> out = make_buffer<float>(size_t(rows * cols));
  if (t.dtype == Dtype::f8_e4m3) {
    const std::vector<float> factors = fp8_factors(t);
    for (int64_t i = 0; i < rows * cols; ++i) {
      if ((t.data[i] & 0x7f) == 0x7f)
        fail(t.file->path(), "tensor '" + name + "' holds an FP8 NaN at [" + std::to_string(i / cols) +
                                 ", " + std::to_string(i % cols) + "]");
      out[i] = fp8_value(t, factors, i);
    }
  } else {
    for (int64_t i = 0; i < rows * cols; ++i) out[i] = element_f32(t, i);
  }
  bytes_ += size_t(rows * cols) * sizeof(float);
  done(t);
  return out;
}

SmallMatrix TensorLoader::small_matrix(const std::string& name, int64_t rows, int64_t cols) {
  const TensorInfo& t = tensor(name, {rows, cols}, /*allow_fp8=*/true);
  SmallMatrix w;
  w.rows = rows;
  w.dim = cols;
  w.dtype = t.dtype == Dtype::bf16 || t.dtype == Dtype::f8_e4m3 ? t.dtype : Dtype::f32;
  if (w.dtype == Dtype::f32) {
    w.f32 = matrix_f32(name, rows, cols);  // counts and finishes the tensor
    return w;
  }
  const size_t n = size_t(rows * cols);
  if (w.dtype == Dtype::bf16) {
    w.b16 = make_buffer<bf16>(n);
    std::memcpy(w.b16.get(), t.data, n * sizeof(bf16));
  } else {
    for (size_t i = 0; i < n; ++i)
      if ((t.data[i] & 0x7f) == 0x7f)
        fail(t.file->path(), "tensor '" + name + "' holds an FP8 NaN at [" + std::to_string(i / size_t(cols)) +
                                 ", " + std::to_string(i % size_t(cols)) + "]");
    w.codes = make_buffer<uint8_t>(n);
    std::memcpy(w.codes.get(), t.data, n);
    const std::vector<float> factors = fp8_factors(t);
    w.factors = make_buffer<float>(factors.size());
    std::copy(factors.begin(), factors.end(), w.factors.get());
  }
  bytes_ += w.bytes();
  done(t);
  return w;
}

// Packs the row-wise concatenation of tensors names[i] ([rows[i]][k] each) as one matrix: as
// packed_int4 when a part is a 4-bit module; INT4 when quantising to INT4 (`quantizable`: a
// decoder layer's weight; or lm_head, with quantize_lm_head); FP8 when every part is FP8 in the
// file, or when quantising to FP8 and no part is FP8 with rows that do not fit; else BF16.
PackedWeights TensorLoader::packed(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
                     int64_t k, bool quantizable, bool lm_head) {
  for (const std::string& name : names)
    if (is_int4_module(store_, module_of(name))) return packed_int4(names, rows, k);
  std::vector<const TensorInfo*> parts;
  for (size_t i = 0; i < names.size(); ++i)
    parts.push_back(&tensor(names[i], {rows[i], k}, /*allow_fp8=*/true));
  return pack_parts(parts, k, quantizable, lm_head);
}

PackedWeights TensorLoader::packed_reshaped(const std::string& name,
                                            const std::vector<int64_t>& shape, int64_t k) {
  TensorInfo flat = tensor(name, shape);
  if (k <= 0 || flat.elements() % k)
    fail(flat.file->path(), "tensor '" + name + "' cannot be read as rows of " + std::to_string(k));
  flat.shape = {flat.elements() / k, k};
  return pack_parts({&flat}, k, /*quantizable=*/false);
}

// Matrix `index` of the 3-D tensor `name` [count][rows][k] (fused experts), packed alone.
PackedWeights TensorLoader::packed_slice(const std::string& name, int64_t count, int64_t rows, int64_t k,
                           int64_t index) {
  const TensorInfo& whole = tensor(name, {count, rows, k});
  TensorInfo part = whole;
  const size_t bytes = size_t(rows * k) * dtype_size(whole.dtype_name);
  part.name = name + "[" + std::to_string(index) + "]";
  part.shape = {rows, k};
  part.data += size_t(index) * bytes;
  part.file_offset += size_t(index) * bytes;
  part.bytes = bytes;
  return pack_parts({&part}, k, true);
}

PackedWeights TensorLoader::pack_parts(const std::vector<const TensorInfo*>& parts, int64_t k,
                         bool quantizable, bool lm_head) {
  int64_t n = 0;
  bool all_fp8 = true;
  for (const TensorInfo* t : parts) {
    all_fp8 = all_fp8 && t->dtype == Dtype::f8_e4m3;
    n += t->shape[0];
  }
  PackedWeights w;
  if (quantize_int4_ && (quantizable || (lm_head && quantize_lm_head_)) && k % 4 == 0) {
    w = make_int4_weights(n, k, int4_quantise_group(k), isa_);
    int64_t row0 = 0;
    for (const TensorInfo* t : parts) {
      quantise_int4(*t, row0, w);
      row0 += t->shape[0];
    }
    int4_bytes_ += w.bytes;
  } else if (all_fp8 || (quantize_fp8_ && quantizable)) {
    w = make_fp8_weights(n, k, isa_);
    int64_t row0 = 0;
    for (const TensorInfo* t : parts) {
      if (row0 % kFp8Cols)
        fail(t->file->path(), "tensor '" + t->name + "' cannot be fused as FP8 after rows that "
                              "are not a multiple of " + std::to_string(kFp8Cols));
      if (t->dtype == Dtype::f8_e4m3)
        copy_fp8(*t, row0, w);
      else
        quantise(*t, row0, w);
      row0 += t->shape[0];
    }
    fp8_bytes_ += w.bytes;
  } else if (parts.size() == 1 && parts[0]->dtype == Dtype::bf16) {
    w = pack_weights(reinterpret_cast<const bf16*>(parts[0]->data), n, k, isa_);
  } else {
    scratch_.resize(size_t(n * k));
    bf16* out = scratch_.data();
    for (const TensorInfo* t : parts) {
      to_bf16(*t, out);
      out += t->elements();
    }
    w = pack_weights(scratch_.data(), n, k, isa_);
  }
  bytes_ += w.bytes;
  for (const TensorInfo* t : parts) done(*t);
  return w;
}

const bf16* TensorLoader::embedding(const std::string& name, int64_t vocab, int64_t hidden,
                                    Buffer<bf16>& copy) {
  const TensorInfo& t = tensor(name, {vocab, hidden});
  const bf16* rows;
  if (t.dtype == Dtype::bf16) {
    rows = reinterpret_cast<const bf16*>(t.data);  // stays mapped; rows fault in on use
    kept_mapped_ += t.bytes;
  } else {
    copy = make_buffer<bf16>(size_t(vocab * hidden));
    for (int64_t i = 0; i < vocab * hidden; ++i) copy[i] = f32_to_bf16(element_f32(t, i));
    rows = copy.get();
    store_.release(t);
  }
  bytes_ += size_t(vocab * hidden) * sizeof(bf16);
  show_progress();
  return rows;
}

void TensorLoader::finish(const std::string& summary) { progress_.finish(summary); }

std::string TensorLoader::module_of(const std::string& weight) {
  const std::string suffix = ".weight";
  return weight.size() > suffix.size() &&
                 weight.compare(weight.size() - suffix.size(), suffix.size(), suffix) == 0
             ? weight.substr(0, weight.size() - suffix.size())
             : weight;
}

// A fused group with 4-bit parts (GPTQ, AWQ): INT4 when every part is 4-bit, else all parts
// as BF16 (the 4-bit ones dequantised).
PackedWeights TensorLoader::packed_int4(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
                          int64_t k) {
  int64_t n = 0;
  bool all_int4 = true;
  for (size_t i = 0; i < names.size(); ++i) {
    all_int4 = all_int4 && is_int4_module(store_, module_of(names[i]));
    n += rows[i];
  }
  PackedWeights w;
  if (all_int4) {
    w = make_int4_weights(n, k, int4_module_group(store_, int4_, module_of(names[0]), rows[0], k),
                          isa_);
    int64_t row0 = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      read_int4_module(store_, int4_, module_of(names[i]), rows[i], row0, w);
      row0 += rows[i];
      show_progress();
    }
    int4_bytes_ += w.bytes;
  } else {
    scratch_.resize(size_t(n * k));
    bf16* out = scratch_.data();
    for (size_t i = 0; i < names.size(); ++i) {
      if (is_int4_module(store_, module_of(names[i]))) {
        dequantise_int4_module(store_, int4_, module_of(names[i]), rows[i], k, out);
        show_progress();
      } else {
        const TensorInfo& t = tensor(names[i], {rows[i], k}, /*allow_fp8=*/true);
        to_bf16(t, out);
        done(t);
      }
      out += rows[i] * k;
    }
    w = pack_weights(scratch_.data(), n, k, isa_);
  }
  bytes_ += w.bytes;
  return w;
}

// Weight t as BF16 values (FP8: code x factor, rounded).
void TensorLoader::to_bf16(const TensorInfo& t, bf16* out) {
  const int64_t count = t.elements();
  if (t.dtype == Dtype::bf16) {
    std::memcpy(out, t.data, size_t(count) * 2);
  } else if (t.dtype == Dtype::f8_e4m3) {
    std::vector<float> factors = fp8_factors(t);
    for (int64_t i = 0; i < count; ++i) out[i] = f32_to_bf16(fp8_value(t, factors, i));
  } else {
    for (int64_t i = 0; i < count; ++i) out[i] = f32_to_bf16(element_f32(t, i));
  }
}

// Weight t (any float dtype, FP8 as code x factor) quantised to 4 bits (quantise_int4_rows) as
// rows [row0, row0 + rows) of w, 32 rows at a time.
void TensorLoader::quantise_int4(const TensorInfo& t, int64_t row0, PackedWeights& w) {
  const int64_t rows = t.shape[0], k = w.k, step = 32;
  std::vector<float> factors;
  if (t.dtype == Dtype::f8_e4m3) factors = fp8_factors(t);
  std::vector<float> values(size_t(step * k));
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    const int64_t count = std::min(step, rows - r0);
    for (int64_t i = 0; i < count * k; ++i) {
      const int64_t e = r0 * k + i;
      values[i] = factors.empty() ? element_f32(t, e) : fp8_value(t, factors, e);
      if (!std::isfinite(values[i]))
        fail(t.file->path(), "tensor '" + t.name + "' holds a non-finite value at [" +
                                 std::to_string(e / k) + ", " + std::to_string(e % k) +
                                 "]: cannot quantise it");
    }
    quantise_int4_rows(values.data(), count, row0 + r0, w);
  }
}

// The checked factors of FP8 weight t, [ceil(rows / 128)][ceil(k / 128)].
std::vector<float> TensorLoader::fp8_factors(const TensorInfo& t) {
  const std::string& file = t.file->path();
  const std::string name = scale_name(t.name);
  const TensorInfo* s = store_.find(name);
  if (!s)
    fail(file, "tensor '" + t.name + "' is F8_E4M3 but its factors '" + name + "' are missing");
  const std::vector<int64_t> shape = {(t.shape[0] + kFp8BlockK - 1) / kFp8BlockK,
                                      (t.shape[1] + kFp8BlockK - 1) / kFp8BlockK};
  if (s->dtype != Dtype::f32 && s->dtype != Dtype::bf16 && s->dtype != Dtype::f16)
    fail(s->file->path(), "tensor '" + name + "' has dtype " + s->dtype_name +
                              ", expected F32 or BF16 block factors");
  if (s->shape != shape)
    fail(s->file->path(), "tensor '" + name + "' has shape " + shape_string(s->shape) +
                              ", expected " + shape_string(shape) + " (one factor per 128x128 "
                              "block of '" + t.name + "' " + shape_string(t.shape) + ")");
  std::vector<float> factors(size_t(s->elements()));
  for (int64_t i = 0; i < s->elements(); ++i) {
    factors[i] = element_f32(*s, i);
    if (!(factors[i] > 0) || !std::isfinite(factors[i]))
      fail(s->file->path(), "tensor '" + name + "' holds " + std::to_string(factors[i]) +
                                " for block [" + std::to_string(i / shape[1]) + ", " +
                                std::to_string(i % shape[1]) +
                                "]: factors must be finite and positive");
  }
  store_.release(*s);
  return factors;
}

// Element e of FP8 weight t [rows][k]: its code times its 128x128 block's factor.
float TensorLoader::fp8_value(const TensorInfo& t, const std::vector<float>& factors, int64_t e) {
  const int64_t k = t.shape[1], k_blocks = (k + kFp8BlockK - 1) / kFp8BlockK;
  return fp8_e4m3_to_f32(t.data[e]) * factors[(e / k / kFp8BlockK) * k_blocks + e % k / kFp8BlockK];
}

// FP8 weight t as rows [row0, row0 + rows) of w.
void TensorLoader::copy_fp8(const TensorInfo& t, int64_t row0, PackedWeights& w) {
  std::vector<float> factors = fp8_factors(t);
  const int64_t rows = t.shape[0], k = w.k;
  for (int64_t j = 0; j < rows; ++j) {
    const uint8_t* row = t.data + j * k;
    uint8_t* dst = w.codes.get() + fp8_code_index(w, row0 + j, 0);
    for (int64_t kk = 0; kk < k; ++kk) {
      if ((row[kk] & 0x7f) == 0x7f)
        fail(t.file->path(), "tensor '" + t.name + "' holds an FP8 NaN at [" +
                                 std::to_string(j) + ", " + std::to_string(kk) + "]");
      dst[kk * kFp8Cols] = row[kk];
    }
    if (j % kFp8Cols == 0)
      for (int64_t kb = 0; kb < w.k_blocks; ++kb)
        w.scales[fp8_scale_index(w, row0 + j, kb)] = factors[(j / kFp8BlockK) * w.k_blocks + kb];
  }
}

// Non-FP8 weight t quantised (fp8_block_factor, fp8_quantise) as rows [row0, row0 + rows) of
// w, 128 rows at a time.
void TensorLoader::quantise(const TensorInfo& t, int64_t row0, PackedWeights& w) {
  const int64_t rows = t.shape[0], k = w.k;
  std::vector<float> values(size_t(kFp8BlockK * k)), factors(size_t(w.k_blocks));
  for (int64_t r0 = 0; r0 < rows; r0 += kFp8BlockK) {
    const int64_t block_rows = std::min(kFp8BlockK, rows - r0);
    std::fill(factors.begin(), factors.end(), 0.0f);
    for (int64_t i = 0; i < block_rows * k; ++i) {
      values[i] = element_f32(t, r0 * k + i);
      if (!std::isfinite(values[i]))
        fail(t.file->path(), "tensor '" + t.name + "' holds a non-finite value at [" +
                                 std::to_string(r0 + i / k) + ", " + std::to_string(i % k) +
                                 "]: cannot quantise it");
      float& largest = factors[(i % k) / kFp8BlockK];
      largest = std::max(largest, std::fabs(values[i]));
    }
    for (float& f : factors) f = fp8_block_factor(f);
    for (int64_t j = 0; j < block_rows; ++j) {
      uint8_t* dst = w.codes.get() + fp8_code_index(w, row0 + r0 + j, 0);
      for (int64_t kk = 0; kk < k; ++kk)
        dst[kk * kFp8Cols] = fp8_quantise(values[j * k + kk], factors[kk / kFp8BlockK]);
      if (j % kFp8Cols == 0)
        for (int64_t kb = 0; kb < w.k_blocks; ++kb)
          w.scales[fp8_scale_index(w, row0 + r0 + j, kb)] = factors[kb];
    }
  }
}

}  // namespace ellm
