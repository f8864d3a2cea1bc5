#include "model/weights.h"

#include <cstring>

#include "base/error.h"
#include "base/log.h"

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
    case Dtype::other: break;
  }
  return 0;
}

class Loader {
 public:
  Loader(const SafetensorsStore& store, const ModelConfig& config, Isa isa, size_t n_tensors)
      : store_(store), isa_(isa), progress_("loading weights", n_tensors) {}

  // The tensor `name`, checked to have exactly `shape` and a float dtype.
  const TensorInfo& tensor(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorInfo& t = store_.get(name);
    const std::string& file = t.file->path();
    if (t.dtype == Dtype::other)
      fail(file, "tensor '" + name + "' has dtype " + t.dtype_name + ", expected BF16, F16 or F32");
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

  Buffer<float> matrix_f32(const std::string& name, int64_t rows, int64_t cols) {
    const TensorInfo& t = tensor(name, {rows, cols});
    Buffer<float> out = make_buffer<float>(size_t(rows * cols));
    for (int64_t i = 0; i < rows * cols; ++i) out[i] = element_f32(t, i);
    bytes_ += size_t(rows * cols) * sizeof(float);
    done(t);
    return out;
  }

  // Packs the row-wise concatenation of tensors names[i] ([rows[i]][k] each) as one matrix.
  PackedWeights packed(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
                       int64_t k) {
    std::vector<const TensorInfo*> parts;
    int64_t n = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      parts.push_back(&tensor(names[i], {rows[i], k}));
      n += rows[i];
    }
    PackedWeights w;
    if (parts.size() == 1 && parts[0]->dtype == Dtype::bf16) {
      w = pack_weights(reinterpret_cast<const bf16*>(parts[0]->data), n, k, isa_);
    } else {
      scratch_.resize(size_t(n * k));
      bf16* out = scratch_.data();
      for (const TensorInfo* t : parts) {
        int64_t count = t->elements();
        if (t->dtype == Dtype::bf16)
          std::memcpy(out, t->data, size_t(count) * 2);
        else
          for (int64_t i = 0; i < count; ++i) out[i] = f32_to_bf16(element_f32(*t, i));
        out += count;
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
  void finish(const std::string& summary) { progress_.finish(summary); }

 private:
  const SafetensorsStore& store_;
  Isa isa_;
  Progress progress_;
  size_t loaded_ = 0;
  size_t bytes_ = 0;
  std::vector<bf16> scratch_;
};

}  // namespace

ModelWeights load_weights(const std::string& model_dir, const ModelConfig& c, Isa isa) {
  ModelWeights m;
  m.store = SafetensorsStore::open(model_dir);
  size_t expected = 3;  // embedding, final norm, lm_head (or the embedding packed again)
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    expected += 8 + (c.is_moe_layer(l) ? 1 + 3 * c.num_experts : 3);
  Loader load(m.store, c, isa, expected);

  const int64_t H = c.hidden_size, V = c.vocab_size, Q = c.q_dim(), KV = c.kv_dim();
  load.embedding(m, "model.embed_tokens.weight", V, H);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = m.layers.emplace_back();
    L.input_norm = load.vector_f32(p + "input_layernorm.weight", H);
    L.qkv = load.packed({p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                         p + "self_attn.v_proj.weight"},
                        {Q, KV, KV}, H);
    L.q_norm = load.vector_f32(p + "self_attn.q_norm.weight", c.head_dim);
    L.k_norm = load.vector_f32(p + "self_attn.k_norm.weight", c.head_dim);
    L.o_proj = load.packed({p + "self_attn.o_proj.weight"}, {H}, Q);
    L.post_attention_norm = load.vector_f32(p + "post_attention_layernorm.weight", H);
    L.is_moe = c.is_moe_layer(l);
    if (L.is_moe) {
      if (m.store.find(p + "mlp.experts." + std::to_string(c.num_experts) + ".gate_proj.weight"))
        fail(m.store.file_for(p + "mlp.gate.weight"),
             "layer " + std::to_string(l) + " has more experts than num_experts = " +
                 std::to_string(c.num_experts) + " in config.json");
      L.moe.router = load.matrix_f32(p + "mlp.gate.weight", c.num_experts, H);
      const int64_t F = c.moe_intermediate_size;
      for (int64_t e = 0; e < c.num_experts; ++e) {
        std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        SwiGluWeights& expert = L.moe.experts.emplace_back();
        expert.gate_up = load.packed({q + "gate_proj.weight", q + "up_proj.weight"}, {F, F}, H);
        expert.down = load.packed({q + "down_proj.weight"}, {H}, F);
        m.expert_bytes += expert.gate_up.bytes + expert.down.bytes;
      }
    } else {
      const int64_t F = c.intermediate_size;
      L.mlp.gate_up = load.packed({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, {F, F}, H);
      L.mlp.down = load.packed({p + "mlp.down_proj.weight"}, {H}, F);
    }
  }
  m.final_norm = load.vector_f32("model.norm.weight", H);
  if (c.tie_word_embeddings) {
    m.lm_head = load.packed({"model.embed_tokens.weight"}, {V}, H);
  } else {
    m.lm_head = load.packed({"lm_head.weight"}, {V}, H);
  }
  m.bytes = load.bytes();
  load.finish(std::to_string(m.bytes >> 20) + " MiB");
  return m;
}

}  // namespace ellm
