#include "model/vision/vision_ops.h"

#include <cmath>

namespace ellm {
namespace {

// fn(begin, end) on each member's share of [0, n).
template <class Fn>
void split(ThreadTeam& team, int64_t n, Fn&& fn) {
  team.run([&](int member, int n_members) {
    auto [begin, end] = split_range(n, member, n_members);
    if (begin < end) fn(begin, end);
  });
}

float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f)); }

}  // namespace

void vision_linear(ThreadTeam& team, const bf16* x, int64_t m, int64_t ldx, const VisionLinear& w,
                   float* y, int64_t ldy, bool accumulate) {
  team.run([&](int member, int n_members) {
    matmul(x, m, ldx, w.weight, y, ldy, accumulate, member, n_members);
  });
  split(team, m, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for (int64_t j = 0; j < w.weight.n; ++j) y[i * ldy + j] += w.bias[j];
  });
}

void layer_norm_to_bf16(ThreadTeam& team, const float* x, int64_t m, int64_t dim,
                        const VisionNorm& norm, float eps, bf16* out) {
  split(team, m, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* row = x + i * dim;
      double sum = 0, squares = 0;
      for (int64_t d = 0; d < dim; ++d) sum += row[d];
      const double mean = sum / double(dim);
      for (int64_t d = 0; d < dim; ++d) squares += (row[d] - mean) * (row[d] - mean);
      const float inv = float(1.0 / std::sqrt(squares / double(dim) + double(eps)));
      const float mean_f = float(mean);
      for (int64_t d = 0; d < dim; ++d)
        out[i * dim + d] = f32_to_bf16((row[d] - mean_f) * inv * norm.weight[d] + norm.bias[d]);
    }
  });
}

// x is overwritten by the activations (the tanh GELU in place, then converted).
void gelu_to_bf16(ThreadTeam& team, float* x, int64_t count, bool tanh_approximation, bf16* out) {
  split(team, count, [&](int64_t begin, int64_t end) {
    if (tanh_approximation) {
      gelu_tanh(x + begin, x + begin, end - begin);
      convert_f32_to_bf16(x + begin, out + begin, end - begin);
    } else {
      for (int64_t i = begin; i < end; ++i) out[i] = f32_to_bf16(gelu_erf(x[i]));
    }
  });
}

void to_bf16(ThreadTeam& team, const float* x, int64_t count, bf16* out) {
  split(team, count, [&](int64_t begin, int64_t end) {
    convert_f32_to_bf16(x + begin, out + begin, end - begin);
  });
}

}  // namespace ellm
