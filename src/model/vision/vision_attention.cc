#include "model/vision/vision_attention.h"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"

namespace ellm {
namespace {

// The scratch: the keys per head, [heads][patches][head_dim]; the values transposed per head and
// frame, [heads][frames][head_dim][frame_len] (so a weighted sum is a row product); each
// member's scores, [kVisionQueryBlock][frame_len].
struct Layout {
  float* keys;
  float* values_t;
  float* scores;
};

Layout layout(const VisionAttentionShape& s, float* scratch) {
  const int64_t per_head = s.patches() * s.head_dim;
  return {scratch, scratch + s.heads * per_head, scratch + 2 * s.heads * per_head};
}

}  // namespace

size_t vision_attention_scratch_floats(int64_t heads, int64_t head_dim, int64_t max_patches,
                                       int64_t max_frame_len, int n_members) {
  return size_t(2 * heads * max_patches * head_dim + n_members * kVisionQueryBlock * max_frame_len);
}

void vision_attention(ThreadTeam& team, const VisionAttentionShape& s, const float* qkv,
                      float* scratch, float* out) {
  const int64_t H = s.hidden(), hd = s.head_dim, N = s.patches(), S = s.frame_len;
  const Layout b = layout(s, scratch);
  team.run([&](int member, int n_members) {
    auto [begin, end] = split_range(N, member, n_members);
    for (int64_t i = begin; i < end; ++i) {
      const float* row = qkv + i * 3 * H;
      const int64_t frame = i / S, at = i % S;
      for (int64_t h = 0; h < s.heads; ++h) {
        std::copy_n(row + H + h * hd, hd, b.keys + (h * N + i) * hd);
        float* v = b.values_t + (h * s.frames + frame) * hd * S + at;
        for (int64_t d = 0; d < hd; ++d) v[d * S] = row[2 * H + h * hd + d];
      }
    }
  });

  const int64_t blocks = (S + kVisionQueryBlock - 1) / kVisionQueryBlock;
  const float scale = 1.0f / std::sqrt(float(hd));
  team.run([&](int member, int n_members) {
    float* scores = b.scores + member * kVisionQueryBlock * S;
    auto [begin, end] = split_range(s.heads * s.frames * blocks, member, n_members);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / (s.frames * blocks), frame = item / blocks % s.frames;
      const int64_t q0 = frame * S + item % blocks * kVisionQueryBlock;
      const int64_t n_q = std::min(kVisionQueryBlock, (frame + 1) * S - q0);
      dot_rows_f32(qkv + q0 * 3 * H + h * hd, n_q, 3 * H, b.keys + (h * N + frame * S) * hd, S, hd,
                   scores, S);
      for (int64_t q = 0; q < n_q; ++q) {
        float* row = scores + q * S;
        const float top = *std::max_element(row, row + S);
        float sum = 0;
        for (int64_t k = 0; k < S; ++k) sum += row[k] = std::exp((row[k] - top) * scale);
        const float inv = 1.0f / sum;
        for (int64_t k = 0; k < S; ++k) row[k] *= inv;
      }
      dot_rows_f32(scores, n_q, S, b.values_t + (h * s.frames + frame) * hd * S, hd, S,
                   out + q0 * H + h * hd, H);
    }
  });
}

}  // namespace ellm
