#pragma once
// The tower's attention: every patch attends to every patch of its own frame, no mask
// (transformers' cu_seqlens: one sequence per frame of each image). Both products run on the
// tier's BF16 matrix kernels (each head and frame's keys, and its values transposed, packed as a
// weight matrix per call), the softmax in FP32 with its probabilities rounded to BF16 for the
// second product.
#include <cstddef>
#include <cstdint>

#include "base/threads.h"

namespace ellm {

struct VisionAttentionShape {
  int64_t heads, head_dim;
  int64_t frames, frame_len;  // patches = frames x frame_len
  int64_t patches() const { return frames * frame_len; }
  int64_t hidden() const { return heads * head_dim; }
};

// Queries scored at once by one member.
constexpr int64_t kVisionQueryBlock = 64;

// The floats of scratch vision_attention needs with n_members members, for any shape of up to
// max_patches patches in frames of up to max_frame_len.
size_t vision_attention_scratch_floats(int64_t heads, int64_t head_dim, int64_t max_patches,
                                       int64_t max_frame_len, int n_members);

// out [patches][hidden] = softmax(q k^T / sqrt(head_dim)) v per head and frame, with q, k, v
// the three [hidden] parts of each row of qkv [patches][3 hidden] (q and k already rotated).
// Allocates the packed keys and values of each call.
void vision_attention(ThreadTeam& team, const VisionAttentionShape& shape, const float* qkv,
                      float* scratch, float* out);

}  // namespace ellm
