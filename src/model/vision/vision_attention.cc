#include "model/vision/vision_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/kernels.h"

namespace ellm {
namespace {

// The scratch, in floats: the queries as BF16, [patches][hidden]; then per member its scores,
// [kVisionQueryBlock][frame_len] floats, its probabilities as BF16 (as many), and its staging
// of one head and frame's keys or transposed values as BF16 ([frame_len][head_dim]).
struct MemberScratch {
  float* scores;
  bf16* probabilities;
  bf16* staging;
};

size_t member_floats(int64_t head_dim, int64_t frame_len) {
  const size_t block = size_t(kVisionQueryBlock * frame_len);
  return block + (block + 1) / 2 + size_t(frame_len * head_dim + 1) / 2 + 16;  // 64-byte slack
}

MemberScratch member_scratch(float* scratch, int64_t patches, int64_t hidden, int64_t head_dim,
                             int64_t frame_len, int member) {
  float* base = scratch + (size_t(patches * hidden) + 1) / 2 + member * member_floats(head_dim, frame_len);
  const size_t block = size_t(kVisionQueryBlock * frame_len);
  bf16* probabilities = reinterpret_cast<bf16*>(base + block);
  return {base, probabilities, probabilities + block + 1};
}

}  // namespace

size_t vision_attention_scratch_floats(int64_t heads, int64_t head_dim, int64_t max_patches,
                                       int64_t max_frame_len, int n_members) {
  return (size_t(max_patches * heads * head_dim) + 1) / 2 +
         size_t(n_members) * member_floats(head_dim, max_frame_len);
}

void vision_attention(ThreadTeam& team, const VisionAttentionShape& s, const float* qkv,
                      float* scratch, float* out) {
  const int64_t H = s.hidden(), hd = s.head_dim, N = s.patches(), S = s.frame_len;
  const int64_t sequences = s.heads * s.frames;
  const Isa isa = active_isa();
  bf16* queries = reinterpret_cast<bf16*>(scratch);
  std::vector<PackedWeights> keys(static_cast<size_t>(sequences)), values_t(keys.size());
  team.run([&](int member, int n_members) {
    auto [row0, row1] = split_range(N, member, n_members);
    for (int64_t i = row0; i < row1; ++i) convert_f32_to_bf16(qkv + i * 3 * H, queries + i * H, H);
    const MemberScratch m = member_scratch(scratch, N, H, hd, S, member);
    auto [begin, end] = split_range(sequences, member, n_members);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / s.frames, frame = item % s.frames;
      const float* rows = qkv + frame * S * 3 * H + h * hd;
      for (int64_t j = 0; j < S; ++j) convert_f32_to_bf16(rows + j * 3 * H + H, m.staging + j * hd, hd);
      keys[size_t(item)] = pack_weights(m.staging, S, hd, isa);
      for (int64_t j = 0; j < S; ++j)
        for (int64_t d = 0; d < hd; ++d) m.staging[d * S + j] = f32_to_bf16(rows[j * 3 * H + 2 * H + d]);
      values_t[size_t(item)] = pack_weights(m.staging, hd, S, isa);
    }
  });

  const int64_t blocks = (S + kVisionQueryBlock - 1) / kVisionQueryBlock;
  const float scale = 1.0f / std::sqrt(float(hd));
  team.run([&](int member, int n_members) {
    const MemberScratch m = member_scratch(scratch, N, H, hd, S, member);
    auto [begin, end] = split_range(sequences * blocks, member, n_members);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t sequence = item / blocks, h = sequence / s.frames, frame = sequence % s.frames;
      const int64_t q0 = frame * S + item % blocks * kVisionQueryBlock;
      const int64_t n_q = std::min(kVisionQueryBlock, (frame + 1) * S - q0);
      matmul(queries + q0 * H + h * hd, n_q, H, keys[size_t(sequence)], m.scores, S, false, 0, 1);
      // The weights stay unnormalised through the second product (each in (0, 1]); its rows
      // are divided by their sums after it, hd values a row instead of S.
      float inverse_sums[kVisionQueryBlock];
      for (int64_t q = 0; q < n_q; ++q) {
        inverse_sums[q] = 1.0f / softmax_exp(m.scores + q * S, S, scale);
        convert_f32_to_bf16(m.scores + q * S, m.probabilities + q * S, S);
      }
      float* o = out + q0 * H + h * hd;
      matmul(m.probabilities, n_q, S, values_t[size_t(sequence)], o, H, false, 0, 1);
      for (int64_t q = 0; q < n_q; ++q)
        for (int64_t d = 0; d < hd; ++d) o[q * H + d] *= inverse_sums[q];
    }
  });
}

}  // namespace ellm
