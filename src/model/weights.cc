#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "model/int4_weights.h"

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

std::string scale_name(const std::string& weight) { return weight + "_scale_inv"; }

class Loader {
 public:
  Loader(const SafetensorsStore& store, const ModelConfig& config, Isa isa, size_t n_tensors,
         bool quantize_fp8, bool quantize_int4, bool quantize_lm_head)
      : store_(store), isa_(isa), quantize_fp8_(quantize_fp8), quantize_int4_(quantize_int4),
        quantize_lm_head_(quantize_lm_head), int4_(config.int4), progress_("loading weights", n_tensors) {}

  // The tensor `name`, checked to have exactly `shape` and a float dtype (F8_E4M3 only where
  // allow_fp8: linear weights).
  const TensorInfo& tensor(const std::string& name, const std::vector<int64_t>& shape,
                           bool allow_fp8 = false) {
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

  void done(const TensorInfo& t) {
    store_.release(t);
    progress_.update(++loaded_);
  }

  Buffer<float> vector_f32(const std::string& name, int64_t n) {
    const TensorInfo& t = tensor(name, {n});
    Buffer<float> out = make_buffer<float>(size_t(n));
    for (int64_t i = 0; i < n; ++i) out[i] = element_f32(t, i);
    bytes_ += size_t(n) * sizeof(float);
    done(t);
    return out;
  }

  // A (1 + w) RMSNorm weight (Qwen3.5), as the weight the kernels multiply by.
  Buffer<float> vector_f32_plus_one(const std::string& name, int64_t n) {
    Buffer<float> out = vector_f32(name, n);
    for (int64_t i = 0; i < n; ++i) out[i] += 1.0f;
    return out;
  }

  // conv1d.weight [channels][1][taps] as [taps][channels].
  Buffer<float> conv_weight(const std::string& name, int64_t channels, int64_t taps) {
    const TensorInfo& t = tensor(name, {channels, 1, taps});
    Buffer<float> out = make_buffer<float>(size_t(channels * taps));
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t j = 0; j < taps; ++j) out[j * channels + c] = element_f32(t, c * taps + j);
    bytes_ += size_t(channels * taps) * sizeof(float);
    done(t);
    return out;
  }

  Buffer<float> matrix_f32(const std::string& name, int64_t rows, int64_t cols) {
    const TensorInfo& t = tensor(name, {rows, cols});
    Buffer<float> out = make_buffer<float>(size_t(rows * cols));
    for (int64_t i = 0; i < rows * cols; ++i) out[i] = element_f32(t, i);
    bytes_ += size_t(rows * cols) * sizeof(float);
    done(t);
    return out;
  }

  // Packs the row-wise concatenation of tensors names[i] ([rows[i]][k] each) as one matrix: as
  // packed_int4 when a part is a 4-bit module; INT4 when quantising to INT4 (`quantizable`: a
  // decoder layer's weight; or lm_head, with quantize_lm_head); FP8 when every part is FP8 in the
  // file, or when quantising to FP8 and no part is FP8 with rows that do not fit; else BF16.
  PackedWeights packed(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
                       int64_t k, bool quantizable = true, bool lm_head = false) {
    for (const std::string& name : names)
      if (is_int4_module(store_, module_of(name))) return packed_int4(names, rows, k);
    std::vector<const TensorInfo*> parts;
    for (size_t i = 0; i < names.size(); ++i)
      parts.push_back(&tensor(names[i], {rows[i], k}, /*allow_fp8=*/true));
    return pack_parts(parts, k, quantizable, lm_head);
  }

  // Matrix `index` of the 3-D tensor `name` [count][rows][k] (fused experts), packed alone.
  PackedWeights packed_slice(const std::string& name, int64_t count, int64_t rows, int64_t k,
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

  PackedWeights pack_parts(const std::vector<const TensorInfo*>& parts, int64_t k,
                           bool quantizable, bool lm_head = false) {
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

  void embedding(ModelWeights& m, const std::string& name, int64_t vocab, int64_t hidden) {
    const TensorInfo& t = tensor(name, {vocab, hidden});
    if (t.dtype == Dtype::bf16) {
      m.embedding = reinterpret_cast<const bf16*>(t.data);  // stays mapped; rows fault in on use
    } else {
      m.embedding_copy = make_buffer<bf16>(size_t(vocab * hidden));
      for (int64_t i = 0; i < vocab * hidden; ++i)
        m.embedding_copy[i] = f32_to_bf16(element_f32(t, i));
      m.embedding = m.embedding_copy.get();
    }
    bytes_ += size_t(vocab * hidden) * sizeof(bf16);
    progress_.update(++loaded_);
  }

  size_t bytes() const { return bytes_; }
  size_t fp8_bytes() const { return fp8_bytes_; }
  size_t int4_bytes() const { return int4_bytes_; }
  void finish(const std::string& summary) { progress_.finish(summary); }

 private:
  static std::string module_of(const std::string& weight) {
    const std::string suffix = ".weight";
    return weight.size() > suffix.size() &&
                   weight.compare(weight.size() - suffix.size(), suffix.size(), suffix) == 0
               ? weight.substr(0, weight.size() - suffix.size())
               : weight;
  }

  // A fused group with 4-bit parts (GPTQ, AWQ): INT4 when every part is 4-bit, else all parts
  // as BF16 (the 4-bit ones dequantised). A 4-bit module counts as one tensor in the progress.
  PackedWeights packed_int4(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
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
        progress_.update(++loaded_);
      }
      int4_bytes_ += w.bytes;
    } else {
      scratch_.resize(size_t(n * k));
      bf16* out = scratch_.data();
      for (size_t i = 0; i < names.size(); ++i) {
        if (is_int4_module(store_, module_of(names[i]))) {
          dequantise_int4_module(store_, int4_, module_of(names[i]), rows[i], k, out);
          progress_.update(++loaded_);
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
  void to_bf16(const TensorInfo& t, bf16* out) {
    const int64_t count = t.elements(), k = t.shape[1];
    if (t.dtype == Dtype::bf16) {
      std::memcpy(out, t.data, size_t(count) * 2);
    } else if (t.dtype == Dtype::f8_e4m3) {
      std::vector<float> factors = fp8_factors(t);
      const int64_t k_blocks = (k + kFp8BlockK - 1) / kFp8BlockK;
      for (int64_t i = 0; i < count; ++i)
        out[i] = f32_to_bf16(fp8_e4m3_to_f32(t.data[i]) *
                             factors[(i / k / kFp8BlockK) * k_blocks + i % k / kFp8BlockK]);
    } else {
      for (int64_t i = 0; i < count; ++i) out[i] = f32_to_bf16(element_f32(t, i));
    }
  }

  // Weight t (any float dtype, FP8 as code x factor) quantised to 4 bits (quantise_int4_rows) as
  // rows [row0, row0 + rows) of w, 32 rows at a time.
  void quantise_int4(const TensorInfo& t, int64_t row0, PackedWeights& w) {
    const int64_t rows = t.shape[0], k = w.k, step = 32;
    std::vector<float> factors;
    if (t.dtype == Dtype::f8_e4m3) factors = fp8_factors(t);
    const int64_t k_blocks = (k + kFp8BlockK - 1) / kFp8BlockK;
    std::vector<float> values(size_t(step * k));
    for (int64_t r0 = 0; r0 < rows; r0 += step) {
      const int64_t count = std::min(step, rows - r0);
      for (int64_t i = 0; i < count * k; ++i) {
        const int64_t e = r0 * k + i;
        values[i] = factors.empty()
                        ? element_f32(t, e)
                        : fp8_e4m3_to_f32(t.data[e]) *
                              factors[(e / k / kFp8BlockK) * k_blocks + e % k / kFp8BlockK];
        if (!std::isfinite(values[i]))
          fail(t.file->path(), "tensor '" + t.name + "' holds a non-finite value at [" +
                                   std::to_string(e / k) + ", " + std::to_string(e % k) +
                                   "]: cannot quantise it");
      }
      quantise_int4_rows(values.data(), count, row0 + r0, w);
    }
  }

  // The checked factors of FP8 weight t, [ceil(rows / 128)][ceil(k / 128)].
  std::vector<float> fp8_factors(const TensorInfo& t) {
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

  // FP8 weight t as rows [row0, row0 + rows) of w.
  void copy_fp8(const TensorInfo& t, int64_t row0, PackedWeights& w) {
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
  void quantise(const TensorInfo& t, int64_t row0, PackedWeights& w) {
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

  const SafetensorsStore& store_;
  Isa isa_;
  bool quantize_fp8_, quantize_int4_, quantize_lm_head_;
  Int4Quantization int4_;
  Progress progress_;
  size_t loaded_ = 0;
  size_t bytes_ = 0, fp8_bytes_ = 0, int4_bytes_ = 0;
  std::vector<bf16> scratch_;
};

}  // namespace

namespace {

// A Qwen3 layer's attention, or a Qwen3.5 layer's mixer (Gated DeltaNet or gated attention):
// the weights before post_attention_layernorm.
void load_mixer(Loader& load, const ModelConfig& c, const std::string& p, LayerWeights& L) {
  const int64_t H = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim();
  if (L.is_linear) {
    const int64_t CD = c.conv_dim(), Hv = c.linear_num_value_heads, VD = c.linear_value_dim();
    const std::string a = p + "linear_attn.";
    GdnWeights& G = L.gdn;
    G.qkvz = load.packed({a + "in_proj_qkv.weight", a + "in_proj_z.weight"}, {CD, VD}, H);
    // Qwen's FP8 checkpoints keep the small b and a projections BF16; so does quantising.
    G.ba = load.packed({a + "in_proj_b.weight", a + "in_proj_a.weight"}, {Hv, Hv}, H,
                       /*quantizable=*/false);
    G.conv = load.conv_weight(a + "conv1d.weight", CD, c.linear_conv_kernel_dim);
    G.A_log = load.vector_f32(a + "A_log", Hv);
    G.dt_bias = load.vector_f32(a + "dt_bias", Hv);
    G.norm = load.vector_f32(a + "norm.weight", c.linear_value_head_dim);
    G.out_proj = load.packed({a + "out_proj.weight"}, {H}, VD);
    return;
  }
  const bool gated = c.is_hybrid();  // q_proj holds [query | gate] per head
  L.qkv = load.packed({p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                       p + "self_attn.v_proj.weight"},
                      {gated ? 2 * Q : Q, KV, KV}, H);
  if (gated) {
    L.q_norm = load.vector_f32_plus_one(p + "self_attn.q_norm.weight", c.head_dim);
    L.k_norm = load.vector_f32_plus_one(p + "self_attn.k_norm.weight", c.head_dim);
  } else {
    L.q_norm = load.vector_f32(p + "self_attn.q_norm.weight", c.head_dim);
    L.k_norm = load.vector_f32(p + "self_attn.k_norm.weight", c.head_dim);
  }
  L.o_proj = load.packed({p + "self_attn.o_proj.weight"}, {H}, Q);
}

// The MoE block: the router, the experts one tensor each (Qwen3, Qwen's FP8 checkpoints) or
// fused into 3-D tensors (the BF16 Qwen3.5 checkpoints), and Qwen3.5's shared expert.
void load_moe(Loader& load, const SafetensorsStore& store, const ModelConfig& c,
              const std::string& p, int64_t l, MoeWeights& moe, size_t& expert_bytes) {
  const int64_t H = c.hidden_size, E = c.num_experts, F = c.moe_intermediate_size;
  if (store.find(p + "mlp.experts." + std::to_string(E) + ".gate_proj.weight"))
    fail(store.file_for(p + "mlp.gate.weight"),
         "layer " + std::to_string(l) + " has more experts than num_experts = " +
             std::to_string(E) + " in config.json");
  moe.router = load.matrix_f32(p + "mlp.gate.weight", E, H);
  const bool fused = store.find(p + "mlp.experts.gate_up_proj") != nullptr;
  for (int64_t e = 0; e < E; ++e) {
    SwiGluWeights& expert = moe.experts.emplace_back();
    if (fused) {  // gate_up_proj [E][2F][H], gate rows first; down_proj [E][H][F]
      expert.gate_up = load.packed_slice(p + "mlp.experts.gate_up_proj", E, 2 * F, H, e);
      expert.down = load.packed_slice(p + "mlp.experts.down_proj", E, H, F, e);
    } else {
      std::string q = p + "mlp.experts." + std::to_string(e) + ".";
      expert.gate_up = load.packed({q + "gate_proj.weight", q + "up_proj.weight"}, {F, F}, H);
      expert.down = load.packed({q + "down_proj.weight"}, {H}, F);
    }
    expert_bytes += expert.gate_up.bytes + expert.down.bytes;
  }
  if (c.shared_expert_intermediate_size > 0) {
    const int64_t FS = c.shared_expert_intermediate_size;
    const std::string q = p + "mlp.shared_expert.";
    moe.has_shared = true;
    moe.shared.gate_up =
        load.packed({q + "gate_proj.weight", q + "up_proj.weight"}, {FS, FS}, H);
    moe.shared.down = load.packed({q + "down_proj.weight"}, {H}, FS);
    moe.shared_gate = load.matrix_f32(p + "mlp.shared_expert_gate.weight", 1, H);
  }
}

}  // namespace

ModelWeights load_weights(const std::string& model_dir, const ModelConfig& c, Isa isa,
                          bool quantize_fp8, bool quantize_int4, bool mtp, bool quantize_lm_head) {
  ModelWeights m;
  m.store = SafetensorsStore::open(model_dir);
  // The text model of Qwen3.5's vision-language wrapper sits under model.language_model. (its
  // lm_head and the MTP head mtp.* at the top level); model.visual.* is not read.
  const std::string root =
      m.store.find("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  const bool hybrid = c.is_hybrid();
  if (mtp && !m.store.find("mtp.fc.weight"))
    fail(model_dir, "the checkpoint has no multi-token-prediction head (no 'mtp.fc.weight'), "
                    "so it cannot draft with mtp");
  size_t expected = 3;  // embedding, final norm, lm_head (or the embedding packed again)
  auto ffn_tensors = [&](bool moe) { return moe ? 1 + 3 * c.num_experts + (hybrid ? 4 : 0) : 3; };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    expected += (c.is_linear_layer(l) ? 10 : 8) + ffn_tensors(c.is_moe_layer(l));
  if (mtp) expected += 4 + 8 + ffn_tensors(c.is_moe());  // fc, its norms, its decoder layer
  Loader load(m.store, c, isa, expected, quantize_fp8, quantize_int4, quantize_lm_head);

  const int64_t H = c.hidden_size, V = c.vocab_size;
  auto norm = [&](const std::string& name, int64_t n) {
    return hybrid ? load.vector_f32_plus_one(name, n) : load.vector_f32(name, n);
  };
  load.embedding(m, root + "embed_tokens.weight", V, H);
  // The decoder layers, then the MTP head's (a full-attention layer of the same kind).
  for (int64_t l = 0; l < c.num_hidden_layers + (mtp ? 1 : 0); ++l) {
    const bool is_mtp = l == c.num_hidden_layers;
    std::string p = is_mtp ? "mtp.layers.0." : root + "layers." + std::to_string(l) + ".";
    LayerWeights& L = m.layers.emplace_back();
    L.is_linear = !is_mtp && c.is_linear_layer(l);
    L.input_norm = norm(p + "input_layernorm.weight", H);
    load_mixer(load, c, p, L);
    L.post_attention_norm = norm(p + "post_attention_layernorm.weight", H);
    L.is_moe = is_mtp ? c.is_moe() : c.is_moe_layer(l);
    if (L.is_moe) {
      load_moe(load, m.store, c, p, l, L.moe, m.expert_bytes);
    } else {
      const int64_t F = c.intermediate_size;
      L.mlp.gate_up = load.packed({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, {F, F}, H);
      L.mlp.down = load.packed({p + "mlp.down_proj.weight"}, {H}, F);
    }
  }
  if (mtp) {
    m.mtp.fc = load.packed({"mtp.fc.weight"}, {H}, 2 * H, /*quantizable=*/false);
    m.mtp.norm_embedding = norm("mtp.pre_fc_norm_embedding.weight", H);
    m.mtp.norm_hidden = norm("mtp.pre_fc_norm_hidden.weight", H);
    m.mtp.norm = norm("mtp.norm.weight", H);
  }
  m.final_norm = norm(root + "norm.weight", H);
  if (c.tie_word_embeddings) {
    m.lm_head = load.packed({root + "embed_tokens.weight"}, {V}, H, /*quantizable=*/false, /*lm_head=*/true);
  } else {
    m.lm_head = load.packed({"lm_head.weight"}, {V}, H, /*quantizable=*/false, /*lm_head=*/true);
  }
  m.bytes = load.bytes();
  m.fp8_bytes = load.fp8_bytes();
  m.int4_bytes = load.int4_bytes();
  std::string summary = std::to_string(m.bytes >> 20) + " MiB";
  if (m.fp8_bytes)
    summary += " (FP8 " + std::to_string(m.fp8_bytes >> 20) + " MiB" +
               (quantize_fp8 ? ", quantised at load)" : ")");
  if (m.int4_bytes)
    summary += " (INT4 " + std::to_string(m.int4_bytes >> 20) + " MiB" +
               (quantize_int4 ? ", quantised at load)" : ")");
  load.finish(summary);
  return m;
}

}  // namespace ellm
