// The MTP head of the shared hybrid models against a second implementation written here from
// docs/models/qwen35.md ("One layer", its MTP head included): the whole Qwen3.5 forward, token by
// token in plain loops (the recurrent delta rule, the conv window, gated attention over an FP16
// cache, dense or MoE FFN), then the head: fc over [norm(embed(x_{t+1})) | norm(h_t)], its
// decoder layer with its own KV, mtp.norm and the shared lm_head, chained on its own output.
// The golden data has no MTP outputs. Products take their inputs rounded to BF16, as the
// engine's do, so the two agree closely; the main model's logits are compared too, which
// checks the reference itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "kernels/kernels.h"
#include "model/config.h"
#include "model/model.h"
#include "model/load/safetensors.h"
#include "model_test_util.h"

namespace ellm {
namespace {

using Vec = std::vector<float>;

float bf(float x) { return bf16_to_f32(f32_to_bf16(x)); }
float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

class Reference {
 public:
  explicit Reference(const std::string& dir)
      : c_(load_model_config(dir)), store_(SafetensorsStore::open(dir)) {
    state_.resize(size_t(c_.num_hidden_layers));
    cache_.resize(size_t(c_.num_hidden_layers));
  }

  // The main model on the next token (its position is the number fed so far): the final normed
  // hidden state, and the logits when asked.
  std::pair<Vec, Vec> step(int32_t token, bool want_logits) {
    const int64_t pos = fed_++;
    Vec x = embed(token);
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      const std::string p = "model.language_model.layers." + std::to_string(l) + ".";
      Vec xn = norm(x, p + "input_layernorm.weight");
      add(x, c_.is_linear_layer(l) ? gdn(p + "linear_attn.", state_[l], xn)
                                   : attention(p + "self_attn.", cache_[l], xn, pos));
      add(x, ffn(p + "mlp.", norm(x, p + "post_attention_layernorm.weight")));
    }
    Vec h = norm(x, "model.language_model.norm.weight");
    return {h, want_logits ? lm_head(h) : Vec()};
  }

  // The MTP head on (hidden state at `pos`, the token after it), at position pos: its output
  // (mtp.norm applied: the next draft's hidden state) and the logits of the token after that.
  std::pair<Vec, Vec> mtp(const Vec& hidden, int32_t token, int64_t pos) {
    Vec in = norm(embed(token), "mtp.pre_fc_norm_embedding.weight");
    Vec hn = norm(hidden, "mtp.pre_fc_norm_hidden.weight");
    in.insert(in.end(), hn.begin(), hn.end());
    Vec x = linear("mtp.fc.weight", in, c_.hidden_size);
    const std::string p = "mtp.layers.0.";
    if (int64_t(mtp_cache_.k.size()) > pos) mtp_cache_.k.resize(size_t(pos)), mtp_cache_.v.resize(size_t(pos));
    add(x, attention(p + "self_attn.", mtp_cache_, norm(x, p + "input_layernorm.weight"), pos));
    add(x, ffn(p + "mlp.", norm(x, p + "post_attention_layernorm.weight")));
    Vec out = norm(x, "mtp.norm.weight");
    return {out, lm_head(out)};
  }

  int64_t vocab() const { return c_.vocab_size; }

 private:
  struct GdnState {
    Vec window, S;
  };
  struct Cache {
    std::vector<Vec> k, v;  // per position [n_kv][head_dim], FP16 values
  };

  Vec tensor(const std::string& name) {
    const TensorInfo& t = store_.get(name);
    Vec out(size_t(t.elements()));
    for (size_t i = 0; i < out.size(); ++i) {
      if (t.dtype == Dtype::f32) {
        std::memcpy(&out[i], t.data + 4 * i, 4);
      } else {
        bf16 v;
        std::memcpy(&v, t.data + 2 * i, 2);
        out[i] = bf16_to_f32(v);
      }
    }
    return out;
  }
  const Vec& w(const std::string& name) {
    auto it = weights_.find(name);
    if (it == weights_.end()) it = weights_.emplace(name, tensor(name)).first;
    return it->second;
  }
  Vec embed(int32_t token) {
    const Vec& e = w("model.language_model.embed_tokens.weight");
    return Vec(e.begin() + token * c_.hidden_size, e.begin() + (token + 1) * c_.hidden_size);
  }
  Vec lm_head(const Vec& h) {
    return linear(c_.tie_word_embeddings ? "model.language_model.embed_tokens.weight" : "lm_head.weight", h,
                  c_.vocab_size);
  }
  static void add(Vec& x, const Vec& y) {
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  }
  // y = W x, x rounded to BF16 (the engine's product inputs); W [out][in] at `offset`.
  Vec linear(const std::string& name, const Vec& x, int64_t out, size_t offset = 0) {
    const Vec& W = w(name);
    Vec y(static_cast<size_t>(out));
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (size_t i = 0; i < x.size(); ++i) acc += double(W[offset + o * x.size() + i]) * bf(x[i]);
      y[o] = float(acc);
    }
    return y;
  }
  // RMSNorm with (1 + w), every Qwen3.5 norm but the GDN output norm.
  Vec norm(const Vec& x, const std::string& name, size_t offset = 0, size_t n = 0) {
    if (n == 0) n = x.size();
    const Vec& weight = w(name);
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += double(x[offset + i]) * x[offset + i];
    const double inv = 1.0 / std::sqrt(ss / double(n) + c_.rms_norm_eps);
    Vec y(n);
    for (size_t i = 0; i < n; ++i) y[i] = float(x[offset + i] * inv * (1.0 + weight[i]));
    return y;
  }

  // Gated DeltaNet on one token (docs/models/qwen35.md, the recurrence).
  Vec gdn(const std::string& p, GdnState& st, const Vec& xn) {
    const int64_t Hk = c_.linear_num_key_heads, Hv = c_.linear_num_value_heads;
    const int64_t dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim, CD = c_.conv_dim();
    if (st.window.empty()) st.window.assign(size_t(3 * CD), 0.0f), st.S.assign(size_t(Hv * dk * dv), 0.0f);
    Vec m = linear(p + "in_proj_qkv.weight", xn, CD), z = linear(p + "in_proj_z.weight", xn, Hv * dv);
    Vec b = linear(p + "in_proj_b.weight", xn, Hv), a = linear(p + "in_proj_a.weight", xn, Hv);
    const Vec& conv = w(p + "conv1d.weight");  // [CD][1][4], tap 3 on the current token
    Vec u(static_cast<size_t>(CD));
    for (int64_t ch = 0; ch < CD; ++ch) {
      double sum = double(conv[ch * 4 + 3]) * m[ch];
      for (int j = 0; j < 3; ++j) sum += double(conv[ch * 4 + j]) * st.window[j * CD + ch];
      u[ch] = silu(float(sum));
      st.window[0 * CD + ch] = st.window[1 * CD + ch];
      st.window[1 * CD + ch] = st.window[2 * CD + ch];
      st.window[2 * CD + ch] = m[ch];
    }
    auto l2 = [&](int64_t at, double scale) {
      double ss = 0;
      for (int64_t i = 0; i < dk; ++i) ss += double(u[at + i]) * u[at + i];
      for (int64_t i = 0; i < dk; ++i) u[at + i] = float(u[at + i] / std::sqrt(ss + 1e-6) * scale);
    };
    for (int64_t i = 0; i < Hk; ++i) l2(i * dk, 1.0 / std::sqrt(double(dk))), l2(Hk * dk + i * dk, 1.0);
    const Vec &A_log = w(p + "A_log"), &dt_bias = w(p + "dt_bias"), &gnorm = w(p + "norm.weight");
    Vec y(static_cast<size_t>(Hv * dv));
    for (int64_t j = 0; j < Hv; ++j) {
      const int64_t i = j / (Hv / Hk);
      const float* q = &u[i * dk];
      const float* k = &u[Hk * dk + i * dk];
      const float* v = &u[2 * Hk * dk + j * dv];
      const double sp = a[j] + dt_bias[j] > 20 ? a[j] + dt_bias[j] : std::log1p(std::exp(double(a[j] + dt_bias[j])));
      const double alpha = std::exp(-std::exp(double(A_log[j])) * sp), beta = sigmoid(b[j]);
      float* S = &st.S[j * dk * dv];  // [dk][dv]
      for (int64_t x = 0; x < dk * dv; ++x) S[x] = float(S[x] * alpha);
      Vec o(static_cast<size_t>(dv));
      for (int64_t col = 0; col < dv; ++col) {
        double sk = 0;
        for (int64_t r = 0; r < dk; ++r) sk += double(S[r * dv + col]) * k[r];
        const double e = v[col] - sk;
        double out = 0;
        for (int64_t r = 0; r < dk; ++r) {
          S[r * dv + col] = float(S[r * dv + col] + k[r] * beta * e);
          out += double(S[r * dv + col]) * q[r];
        }
        o[col] = float(out);
      }
      double ss = 0;
      for (float x : o) ss += double(x) * x;
      const double inv = 1.0 / std::sqrt(ss / double(dv) + c_.rms_norm_eps);
      for (int64_t col = 0; col < dv; ++col)
        y[j * dv + col] = float(gnorm[col] * o[col] * inv * silu(z[j * dv + col]));
    }
    return linear(p + "out_proj.weight", y, c_.hidden_size);
  }

  // Gated full attention on one token at `pos` (docs/models/qwen35.md), K and V cached as FP16.
  Vec attention(const std::string& p, Cache& cache, const Vec& xn, int64_t pos) {
    const int64_t nh = c_.num_attention_heads, nkv = c_.num_key_value_heads, hd = c_.head_dim;
    const int64_t rd = c_.rotary_dim(), half = rd / 2;
    Vec P = linear(p + "q_proj.weight", xn, 2 * nh * hd);
    Vec k = linear(p + "k_proj.weight", xn, nkv * hd), v = linear(p + "v_proj.weight", xn, nkv * hd);
    auto rope = [&](Vec& x) {
      for (int64_t d = 0; d < half; ++d) {
        const float angle = float(pos) * (1.0f / std::pow(float(c_.rope_theta), float(2 * d) / float(rd)));
        const double cs = std::cos(angle), sn = std::sin(angle), x0 = x[d], x1 = x[d + half];
        x[d] = float(x0 * cs - x1 * sn);
        x[d + half] = float(x1 * cs + x0 * sn);
      }
    };
    Vec keys, values;
    for (int64_t h = 0; h < nkv; ++h) {
      Vec kh = norm(k, p + "k_norm.weight", size_t(h * hd), size_t(hd));
      rope(kh);
      for (int64_t d = 0; d < hd; ++d) keys.push_back(f16_to_f32(f32_to_f16(kh[d])));
      for (int64_t d = 0; d < hd; ++d) values.push_back(f16_to_f32(f32_to_f16(v[h * hd + d])));
    }
    cache.k.push_back(keys);
    cache.v.push_back(values);
    Vec o(static_cast<size_t>(nh * hd));
    for (int64_t h = 0; h < nh; ++h) {
      Vec q = norm(P, p + "q_norm.weight", size_t(h * 2 * hd), size_t(hd));
      rope(q);
      const int64_t g = h / (nh / nkv);
      std::vector<double> score(cache.k.size());
      double best = -1e300, sum = 0;
      for (size_t t = 0; t < cache.k.size(); ++t) {
        double s = 0;
        for (int64_t d = 0; d < hd; ++d) s += double(q[d]) * cache.k[t][g * hd + d];
        score[t] = s / std::sqrt(double(hd));
        best = std::max(best, score[t]);
      }
      for (double& s : score) sum += (s = std::exp(s - best));
      for (int64_t d = 0; d < hd; ++d) {
        double acc = 0;
        for (size_t t = 0; t < cache.k.size(); ++t) acc += score[t] * cache.v[t][g * hd + d];
        o[h * hd + d] = float(acc / sum * sigmoid(P[h * 2 * hd + hd + d]));
      }
    }
    return linear(p + "o_proj.weight", o, c_.hidden_size);
  }

  Vec swiglu(const std::string& gate, const std::string& up, const std::string& down, const Vec& xn,
             int64_t F, size_t up_offset = 0, size_t down_offset = 0) {
    Vec g = linear(gate, xn, F, up_offset), u = linear(up, xn, F, up_offset + (gate == up ? F * xn.size() : 0));
    for (int64_t i = 0; i < F; ++i) g[i] = silu(g[i]) * u[i];
    return linear(down, g, c_.hidden_size, down_offset);
  }

  // Dense SwiGLU, or the routed experts (fused) plus the sigmoid-gated shared expert.
  Vec ffn(const std::string& p, const Vec& xn) {
    if (!c_.is_moe())
      return swiglu(p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight", xn, c_.intermediate_size);
    const int64_t E = c_.num_experts, F = c_.moe_intermediate_size, H = c_.hidden_size;
    const Vec& router = w(p + "gate.weight");
    std::vector<double> prob(static_cast<size_t>(E));
    double best = -1e300, sum = 0;
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t i = 0; i < H; ++i) s += double(router[e * H + i]) * xn[i];
      best = std::max(best, prob[e] = s);
    }
    for (double& x : prob) sum += (x = std::exp(x - best));
    std::vector<int64_t> order(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + c_.num_experts_per_tok, order.end(),
                      [&](int64_t a, int64_t b) { return prob[a] > prob[b]; });
    double top = 0;
    for (int64_t i = 0; i < c_.num_experts_per_tok; ++i) top += prob[order[i]];
    Vec out(static_cast<size_t>(H), 0.0f);
    for (int64_t i = 0; i < c_.num_experts_per_tok; ++i) {
      const int64_t e = order[i];
      Vec y = swiglu(p + "experts.gate_up_proj", p + "experts.gate_up_proj", p + "experts.down_proj", xn, F,
                     size_t(e * 2 * F * H), size_t(e * H * F));
      for (int64_t j = 0; j < H; ++j) out[j] += float(prob[e] / top) * y[j];
    }
    const std::string s = p + "shared_expert.";
    Vec shared = swiglu(s + "gate_proj.weight", s + "up_proj.weight", s + "down_proj.weight", xn,
                        c_.shared_expert_intermediate_size);
    const Vec& gate = w(p + "shared_expert_gate.weight");
    double logit = 0;
    for (int64_t i = 0; i < H; ++i) logit += double(gate[i]) * xn[i];
    for (int64_t j = 0; j < H; ++j) out[j] += sigmoid(float(logit)) * shared[j];
    return out;
  }

  ModelConfig c_;
  SafetensorsStore store_;
  std::map<std::string, Vec> weights_;
  std::vector<GdnState> state_;
  std::vector<Cache> cache_;
  Cache mtp_cache_;
  int64_t fed_ = 0;
};

double max_diff(const float* a, const Vec& b) {
  double d = 0;
  for (size_t i = 0; i < b.size(); ++i) d = std::max(d, double(std::abs(a[i] - b[i])));
  return d;
}

int32_t best(const float* row, int64_t V) { return int32_t(std::max_element(row, row + V) - row); }

// Feeds 12 tokens in four passes (a prefill, two decode steps, a speculative group of two), then
// drafts three tokens with the head; and again with the group cut to its first token.
void check_mtp(const std::string& name, double tolerance) {
  const std::string dir = test::shared_dir() + "/models/" + name;
  ServingLimits limits;
  limits.sequence_length = 64;
  limits.threads = 2;
  limits.speculative_tokens = 3;
  limits.mtp = true;
  std::vector<int32_t> x;
  for (int i = 0; i < 12; ++i) x.push_back(300 + (i * 4099) % 30000);

  for (bool cut : {false, true}) {
    auto model = Model::load(dir, limits);
    Reference ref(dir);
    const int64_t V = model->vocab_size();
    std::vector<float> logits(8 * size_t(V));
    auto feed = [&](int32_t from, int32_t to, bool speculative) {
      std::vector<BatchToken> batch;
      for (int32_t p = from; p < to; ++p) batch.push_back({x[p], 0, p, true, speculative});
      model->forward(batch, logits.data());
    };
    feed(0, 8, false);
    feed(8, 9, false);
    feed(9, 10, false);
    feed(10, 12, true);
    model->accept(0, cut ? 11 : 12);
    const int32_t kept = cut ? 11 : 12;

    // The reference: hidden states of the kept tokens, the head's KV over the pairs (h_t, x_t+1).
    std::vector<Vec> h;
    for (int32_t p = 0; p < kept; ++p) {
      auto [hidden, row] = ref.step(x[p], p == kept - 1);
      if (p == kept - 1) {  // eight layers: the chunked delta rule of the prefill rounds differently
        const double diff = max_diff(logits.data() + (cut ? 0 : 1) * V, row);
        std::printf("[%s%s] main model: max |logit diff| %.2e\n", name.c_str(), cut ? " cut" : "", diff);
        EXPECT_LT(diff, 4 * tolerance) << name << " main logits";
      }
      h.push_back(hidden);
    }
    for (int32_t p = 0; p + 1 < kept; ++p) ref.mtp(h[p], x[p + 1], p);

    int32_t next = cut ? 4242 : 777;  // the token the check chose at position `kept`
    Vec hidden = h.back();
    for (int d = 0; d < 3; ++d) {
      std::vector<BatchToken> draft = {{next, 0, kept + d, true}};
      model->mtp_forward(draft, logits.data());
      auto [out, row] = ref.mtp(hidden, next, kept - 1 + d);
      const double diff = max_diff(logits.data(), row);
      std::printf("[%s%s] draft %d: max |logit diff| %.2e\n", name.c_str(), cut ? " cut" : "", d, diff);
      EXPECT_LT(diff, tolerance) << name << " draft " << d << (cut ? " after a cut group" : "");
      EXPECT_EQ(best(logits.data(), V), best(row.data(), V)) << name << " draft " << d;
      next = best(logits.data(), V);
      hidden = out;
    }
  }
}

TEST(MtpHead, DraftsAsTheReferenceDoesDense) { check_mtp("tiny-qwen35", 0.05); }
TEST(MtpHead, DraftsAsTheReferenceDoesMoe) { check_mtp("tiny-qwen35-moe", 0.05); }

TEST(MtpHead, RefusedWhereThereIsNone) {
  ServingLimits limits;
  limits.sequence_length = 64;
  limits.mtp = true;
  EXPECT_EQ(test::error_of([&] { Model::load(test::shared_dir() + "/models/tiny-qwen3", limits); }),
            "--speculative mtp: only the hybrid Qwen3.5+ models have a multi-token-prediction head; qwen3 has none");
  limits.mtp = false;
  auto model = Model::load(test::shared_dir() + "/models/tiny-qwen35", limits);
  std::vector<BatchToken> draft = {{5, 0, 1, true}};
  std::vector<float> logits(size_t(model->vocab_size()));
  EXPECT_EQ(test::error_of([&] { model->mtp_forward(draft, logits.data()); }),
            "mtp_forward: this model has no multi-token-prediction head loaded");
}

}  // namespace
}  // namespace ellm
