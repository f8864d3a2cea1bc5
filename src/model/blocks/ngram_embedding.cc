#include "model/blocks/ngram_embedding.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "model/blocks/activation.h"

namespace ellm {
namespace {

// From this many tokens on, a pass reads its rows ahead and gathers them on every member.
constexpr int64_t kReadAheadTokens = 16;

// SplitMix64's output function and increment (the hash multipliers' generator).
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
uint64_t splitmix64(uint64_t v) {
  v += kGolden;
  v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
  v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
  return v ^ (v >> 31);
}

bool is_prime(int64_t v) {
  if (v < 2) return false;
  if (v % 2 == 0) return v == 2;
  for (int64_t d = 3; d * d <= v; d += 2)
    if (v % d == 0) return false;
  return true;
}

// The int64 buffer `name` of `count` values, exactly.
std::vector<int64_t> int64_buffer(const SafetensorsStore& store, const std::string& name, int64_t count) {
  const TensorInfo& t = store.get(name);
  if (t.dtype_name != "I64" || t.shape != std::vector<int64_t>{count})
    fail(t.file->path(), "tensor '" + name + "' is " + t.dtype_name + " " + shape_string(t.shape) +
                             ", expected I64 [" + std::to_string(count) + "]");
  std::vector<int64_t> out(static_cast<size_t>(count));
  std::memcpy(out.data(), t.data, size_t(count) * sizeof(int64_t));
  return out;
}

// The one scale of an E4M3 table: a finite positive F32, BF16 or F16 value, shape [] or [1].
float table_scale(const SafetensorsStore& store, const std::string& name, const std::string& shard) {
  const TensorInfo* t = store.find(name);
  if (!t)
    fail(store.file_for(shard), "the n-gram table's shards are F8_E4M3 but its scale '" + name + "' is missing");
  const bool one = t->shape.empty() || t->shape == std::vector<int64_t>{1};
  float v = NAN;
  if (one && t->dtype == Dtype::f32) std::memcpy(&v, t->data, sizeof v);
  if (one && t->dtype == Dtype::bf16) v = bf16_to_f32(bf16(t->data[0] | t->data[1] << 8));
  if (one && t->dtype == Dtype::f16) v = f16_to_f32(f16(t->data[0] | t->data[1] << 8));
  if (!one || (t->dtype != Dtype::f32 && t->dtype != Dtype::bf16 && t->dtype != Dtype::f16))
    fail(t->file->path(), "the n-gram table's scale '" + name + "' is " + t->dtype_name + " " +
                              shape_string(t->shape) + ", expected one F32 or BF16 value");
  if (!(v > 0) || !std::isfinite(v))
    fail(t->file->path(), "the n-gram table's scale '" + name + "' is " + std::to_string(v) +
                              ": it must be finite and positive");
  return v;
}

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

NgramHash ngram_hash(const NgramEmbeddingSpec& s) {
  NgramHash h;
  // Odd multipliers below 2^63 / vocab, so that t * m never overflows.
  const uint64_t bound = uint64_t(INT64_MAX) / uint64_t(std::max<int64_t>(s.vocab, 1));
  const uint64_t half = std::max<uint64_t>(1, bound / 2);
  const uint64_t seed = uint64_t(s.seed) + 10007ull * uint64_t(s.module_index);
  for (int64_t i = 0; i < s.ngram_size; ++i)
    h.multipliers.push_back(int64_t(2 * (splitmix64(seed + kGolden * uint64_t(i + 1)) % half) + 1));
  // Head j of module m: the (m heads + j + 1)-th prime after table_base - 1.
  int64_t prime = s.table_base - 1, total = 0;
  for (int64_t j = 0; j < s.module_index * s.heads(); ++j)
    for (++prime; !is_prime(prime);) ++prime;
  for (int64_t j = 0; j < s.heads(); ++j) {
    for (++prime; !is_prime(prime);) ++prime;
    h.sizes.push_back(prime);
    h.offsets.push_back(total);
    total += prime;
  }
  h.rows = (total + s.table_divisor - 1) / s.table_divisor * s.table_divisor;
  return h;
}

std::unique_ptr<NgramEmbeddingWeights> load_ngram_embedding(TensorLoader& load, const std::string& p,
                                                            const NgramEmbeddingSpec& s, int64_t shards) {
  const int64_t H = s.hidden, W = s.width(), E = s.embed_dim, D = s.row_dim();
  auto owned = std::make_unique<NgramEmbeddingWeights>();
  NgramEmbeddingWeights& w = *owned;
  w.key_proj = load.small_matrix(p + "key_proj.weight", W, E);
  w.value_proj = load.small_matrix(p + "value_proj.weight", H, E);
  w.norm_key = load.vector_f32_plus_one(p + "norm_key.weight", W);
  w.norm_query = load.vector_f32_plus_one(p + "norm_query.weight", W);
  w.norm_conv = load.vector_f32_plus_one(p + "norm_conv.weight", W);
  w.conv = load.conv_weight(p + "conv1d.weight", W, s.conv_taps);

  // The stored hash constants must be the config's: another table layout gives other rows.
  const SafetensorsStore& store = load.store();
  const std::string e = p + "ple_embedding.";
  w.hash = ngram_hash(s);
  const std::pair<const char*, const std::vector<int64_t>*> buffers[] = {
      {"layer_multipliers", &w.hash.multipliers},
      {"ngram_heads_vocab_sizes", &w.hash.sizes},
      {"ngram_heads_offsets", &w.hash.offsets}};
  for (const auto& [name, derived] : buffers) {
    const std::vector<int64_t> stored = int64_buffer(store, e + name, int64_t(derived->size()));
    if (stored != *derived)
      fail(store.get(e + name).file->path(),
           "the n-gram hash constant '" + e + name + "' is " + list(stored) + " but the config " +
               "(vocab_size, seed, ngram_vocab_size_base, heads_per_ngram) gives " + list(*derived));
  }

  // The table: its shards in order, each [rows][row_dim] BF16 or E4M3, left in the mapping.
  w.shard_start.push_back(0);
  const std::string table = e + "ngram_embedding.", first = table + "shard_0.weight";
  for (int64_t k = 0; k < shards; ++k) {
    const std::string name = table + "shard_" + std::to_string(k) + ".weight";
    const TensorInfo* t = store.find(name);
    if (!t) fail(store.file_for(name), "missing n-gram table shard '" + name + "' (split_ngram_parts is " +
                                           std::to_string(shards) + ")");
    if ((t->dtype != Dtype::bf16 && t->dtype != Dtype::f8_e4m3) || t->shape.size() != 2 || t->shape[1] != D)
      fail(t->file->path(), "n-gram table shard '" + name + "' is " + t->dtype_name + " " + shape_string(t->shape) +
                                ", expected BF16 or F8_E4M3 [rows, " + std::to_string(D) + "]");
    if (k == 0) w.table_dtype = t->dtype;
    if (t->dtype != w.table_dtype)
      fail(t->file->path(), "n-gram table shard '" + name + "' is " + t->dtype_name + " but shard 0 is " +
                                store.get(first).dtype_name);
    w.shards.push_back(t->data);
    w.shard_start.push_back(w.shard_start.back() + t->shape[0]);
    w.table.add(t->data, t->bytes, *t->file);
  }
  w.row_bytes = size_t(D) * (w.table_dtype == Dtype::bf16 ? sizeof(bf16) : 1);
  if (w.table_dtype == Dtype::f8_e4m3) w.table_scale = table_scale(store, table + "weight_scale", first);
  if (w.shard_start.back() != w.hash.rows)
    fail(store.file_for(e + "ngram_embedding.shard_0.weight"),
         "the n-gram table's " + std::to_string(shards) + " shards hold " +
             std::to_string(w.shard_start.back()) + " rows, but the config gives " + std::to_string(w.hash.rows));
  return owned;
}

void widen_table_row(const NgramEmbeddingWeights& w, const uint8_t* row, int64_t row_dim, float* out) {
  if (w.table_dtype == Dtype::f8_e4m3)
    convert_fp8_e4m3_to_f32(row, w.table_scale, out, row_dim);
  else
    convert_bf16_to_f32(reinterpret_cast<const bf16*>(row), out, row_dim);
}

void plan_ngram_embedding(ActivationPlan& plan, NgramEmbeddingBuffers& b, const NgramEmbeddingSpec& s,
                          size_t T, size_t slots) {
  plan.carve(b.context, slots * 8);
  plan.carve(b.seen, slots);
  plan.carve(b.row_at, T * size_t(s.heads()));
  plan.carve(b.pages, 2 * T * size_t(s.heads()));
  const size_t W = size_t(s.width());
  plan.carve(b.emb, T * size_t(s.embed_dim));
  plan.carve(b.key, T * W);
  plan.carve(b.value, T * size_t(s.hidden));
  plan.carve(b.gated, T * W);
  plan.carve(b.normed, T * W);
}

void ngram_embedding(BlockContext& ctx, const NgramEmbeddingSpec& s, const NgramEmbeddingWeights& w,
                     SequenceMemory& memory, int64_t window, const PassRows& r, NgramEmbeddingBuffers& b) {
  RecurrentState& state = memory.state();
  const int64_t n = r.size(), H = s.hidden, S = s.streams, W = s.width(), E = s.embed_dim;
  const int64_t D = s.row_dim(), N = s.ngram_size, hpn = s.heads_per_ngram;
  const int64_t rows = s.history_rows(), F = s.row_floats();
  auto slot_window = [&](int32_t slot) { return state.extra(slot) + window * rows * F; };
  auto id_of = [&](const float* row) {
    int32_t id;
    std::memcpy(&id, row + W, sizeof id);
    return id;
  };

  // The hash context in token order: a slot's last ids from its window, then from its earlier
  // rows in the pass; each head's row located.                          row_at: [n][heads]
  const int64_t heads = s.heads();
  for (int64_t t = 0; t < n; ++t) b.seen[r.tokens[t].slot] = 0;
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& token = r.tokens[t];
    int32_t* previous = b.context + token.slot * 8;  // newest first
    if (!b.seen[token.slot]) {
      for (int64_t k = 0; k + 1 < N; ++k) previous[k] = id_of(slot_window(token.slot) + (rows - 1 - k) * F);
      b.seen[token.slot] = 1;
    }
    int64_t ids[8];
    ids[0] = token.token;
    bool cut = false;
    for (int64_t k = 1; k < N; ++k) {
      cut = cut || token.position < k;
      ids[k] = cut ? s.eos : previous[k - 1];
      cut = cut || ids[k] == s.eos;  // nothing before an EOS counts
    }
    for (int64_t k = N - 2; k > 0; --k) previous[k] = previous[k - 1];
    previous[0] = token.token;

    uint64_t mix = uint64_t(ids[0]) * uint64_t(w.hash.multipliers[0]);
    for (int64_t k = 2; k <= N; ++k) {
      mix ^= uint64_t(ids[k - 1]) * uint64_t(w.hash.multipliers[k - 1]);
      for (int64_t j = 0; j < hpn; ++j) {
        const int64_t head = (k - 2) * hpn + j;
        const int64_t row = int64_t(mix % uint64_t(w.hash.sizes[head])) + w.hash.offsets[head];
        const int64_t shard =
            std::upper_bound(w.shard_start.begin(), w.shard_start.end(), row) - w.shard_start.begin() - 1;
        b.row_at[t * heads + head] = w.shards[shard] + size_t(row - w.shard_start[shard]) * w.row_bytes;
      }
    }
  }

  // The rows gathered, a prompt's read ahead first and split among the members, so that the
  // page faults of a cold table overlap.                                 emb: [n][E]
  ctx.profiler.time(Op::ngram_gather, 0, double(n * heads) * double(w.row_bytes), [&] {
    auto gather = [&](int64_t begin, int64_t end) {
      const FaultCounter faults;
      for (int64_t t = begin; t < end; ++t)
        for (int64_t head = 0; head < heads; ++head)
          widen_table_row(w, b.row_at[t * heads + head], D, b.emb + (t * heads + head) * D);
      faults.add_to(w.table, uint64_t(end - begin));
    };
    if (n < kReadAheadTokens) return gather(0, n);
    w.table.read_ahead(b.row_at, size_t(n * heads), w.row_bytes, b.pages);
    ctx.rows(n, gather);
  });

  // key, value; the gates against the normed streams; gv and its norm.
  ctx.profiler.time(Op::ngram_proj, 2.0 * double(n * E * (W + H)), double(w.key_proj.bytes() + w.value_proj.bytes()), [&] {
    ctx.dot_rows(b.emb, n, E, w.key_proj, b.key, W);
    ctx.dot_rows(b.emb, n, E, w.value_proj, b.value, H);
    ctx.rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* key = b.key + t * W;
        float* query = b.normed + t * W;
        float* gated = b.gated + t * W;
        for (int64_t st = 0; st < S; ++st) {
          rmsnorm(key + st * H, 1, H, H, w.norm_key.get() + st * H, s.eps, key + st * H, H);
          rmsnorm(r.x + t * W + st * H, 1, H, H, w.norm_query.get() + st * H, s.eps, query + st * H, H);
          float dot = 0;
          for (int64_t i = 0; i < H; ++i) dot += key[st * H + i] * query[st * H + i];
          const float score = dot / std::sqrt(float(H));
          const float sign = score > 0 ? 1.0f : score < 0 ? -1.0f : 0.0f;
          const float gate = sigmoid(std::sqrt(std::max(std::fabs(score), 1e-6f)) * sign);
          for (int64_t i = 0; i < H; ++i) gated[st * H + i] = gate * b.value[t * H + i];
          rmsnorm(gated + st * H, 1, H, H, w.norm_conv.get() + st * H, s.eps, query + st * H, H);
        }
      }
    });
  });

  // c = silu(the dilated causal conv) through each slot's window, token by token in order; each
  // token then pushes its row (rmsnorm(gv), id) into the window. The members split the row's
  // values.                                              c: [n][W], over the keys
  ctx.profiler.time(Op::gdn_conv, 2.0 * double(n * W * s.conv_taps), 0, [&] {
    ctx.team.run([&](int m, int nm) {
      auto [c0, c1] = split_range(F, m, nm);
      if (c0 >= c1) return;
      for (int64_t t = 0; t < n; ++t) {
        const BatchToken& token = r.tokens[t];
        float* history = slot_window(token.slot);  // [rows][F], oldest first
        const float* in = b.normed + t * W;
        float* out = b.key + t * W;
        for (int64_t c = c0; c < std::min(c1, W); ++c) {
          float sum = 0;
          for (int64_t k = 0; k + 1 < s.conv_taps; ++k)  // tap k: ngram_size (taps - 1 - k) back
            sum += w.conv[k * W + c] * history[(k * N) * F + c];
          sum += w.conv[(s.conv_taps - 1) * W + c] * in[c];
          out[c] = silu(sum);
        }
        for (int64_t row = 0; row + 1 < rows; ++row)
          std::memcpy(history + row * F + c0, history + (row + 1) * F + c0, size_t(c1 - c0) * sizeof(float));
        float* newest = history + (rows - 1) * F;
        for (int64_t c = c0; c < c1; ++c)
          if (c < W)
            newest[c] = in[c];
          else
            std::memcpy(newest + W, &token.token, sizeof(int32_t));
        if (token.snapshot)
          for (int64_t row = 0; row < rows; ++row)
            std::memcpy(state.extra_in(token.snapshot) + window * rows * F + row * F + c0, history + row * F + c0,
                        size_t(c1 - c0) * sizeof(float));
      }
    });
  });

  // What a speculative token pushed, for a rollback to replay.
  if (!memory.rollback().empty())
    for (int64_t t = 0; t < n; ++t) {
      const BatchToken& token = r.tokens[t];
      if (!token.speculative) continue;
      float* row = memory.rollback().window_row(window, token.slot, memory.group_index(token.slot, token.position));
      std::memcpy(row, b.normed + t * W, size_t(W) * sizeof(float));
      std::memcpy(row + W, &token.token, sizeof(int32_t));
    }

  // X_s = X_s + gv_s + c_s
  ctx.rows(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * W; i < end * W; ++i) r.x[i] += b.gated[i] + b.key[i];
  });
}

}  // namespace ellm
