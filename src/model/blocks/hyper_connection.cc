#include "model/blocks/hyper_connection.h"

#include <cmath>

#include "model/blocks/activation.h"

namespace ellm {

HyperConnectionWeights load_hyper_connection(TensorLoader& load, const std::string& p,
                                             const HyperConnectionSpec& s, bool with_inject) {
  const int64_t W = s.width();
  HyperConnectionWeights w;
  w.norm = load.vector_f32_plus_one(p + "hc_norm.weight", W);
  w.down = load.small_matrix(p + "input_mix_weight_down.weight", s.lowrank, W);
  w.up = load.small_matrix(p + "input_mix_weight_up.weight", W, s.lowrank);
  if (with_inject) w.inject = load.small_matrix(p + "block_inject_weight.weight", s.streams, W);
  return w;
}

void plan_hyper_weights(ActivationPlan& plan, HyperConnectionBuffers& b, const HyperConnectionSpec& s,
                        size_t T) {
  plan.carve(b.weight, T * size_t(s.streams));
}

void plan_hyper_mix(ActivationPlan& plan, HyperConnectionBuffers& b, const HyperConnectionSpec& s, size_t T) {
  plan.carve(b.xn, T * size_t(s.width()));
  plan.carve(b.a, T * size_t(s.lowrank));
  plan.carve(b.g, T * size_t(s.width()));
}

void hyper_mix(BlockContext& ctx, const HyperConnectionSpec& s, const HyperConnectionWeights& w,
               const float* x, int64_t n, HyperConnectionBuffers& b, float* u) {
  const int64_t H = s.hidden, S = s.streams, W = s.width(), R = s.lowrank;
  if (n <= 0) return;
  ctx.profiler.time(Op::hyper_mix, 2.0 * double(n) * double(W) * double(2 * R + (w.inject ? S : 0)),
                    double(w.down.bytes() + w.up.bytes() + w.inject.bytes()), [&] {
    ctx.rows(n, [&](int64_t begin, int64_t end) {  // each stream normed on its own, the gain spanning all
      for (int64_t t = begin; t < end; ++t)
        for (int64_t st = 0; st < S; ++st)
          rmsnorm(x + t * W + st * H, 1, H, H, w.norm.get() + st * H, s.eps, b.xn + t * W + st * H, H);
    });
    ctx.dot_rows(b.xn, n, W, w.down, b.a, R);
    ctx.rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin * R; i < end * R; ++i) b.a[i] = silu(b.a[i] / float(S));
    });
    ctx.dot_rows(b.a, n, R, w.up, b.g, W);
    if (w.inject) ctx.dot_rows(b.xn, n, W, w.inject, b.weight, S);
    ctx.rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* ut = u + t * H;
        const float* gt = b.g + t * W;
        const float* xt = b.xn + t * W;
        for (int64_t i = 0; i < H; ++i) {
          float sum = 0;
          for (int64_t st = 0; st < S; ++st) sum += sigmoid(gt[st * H + i]) * xt[st * H + i];
          ut[i] = sum / float(S);
        }
        if (w.inject)
          for (int64_t st = 0; st < S; ++st) b.weight[t * S + st] = 2.0f * sigmoid(b.weight[t * S + st] / float(S));
      }
    });
  });
}

void hyper_inject(BlockContext& ctx, const HyperConnectionSpec& s, const HyperConnectionBuffers& b,
                  const float* y, int64_t n, float* x) {
  const int64_t H = s.hidden, S = s.streams, W = s.width();
  ctx.rows(n, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t st = 0; st < S; ++st) {
        const float weight = b.weight[t * S + st];
        float* xs = x + t * W + st * H;
        for (int64_t i = 0; i < H; ++i) xs[i] += weight * y[t * H + i];
      }
  });
}

}  // namespace ellm
