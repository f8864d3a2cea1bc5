#include "model/vision/vision_positions.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ellm {
namespace {

// torch.linspace(0, end, steps) in float32, element i: the first half counts up from 0, the
// second half down from end, as ATen does (so the last element is end exactly).
float linspace_at(float end, int64_t steps, int64_t i) {
  if (steps == 1) return 0.0f;
  const float step = end / float(steps - 1);
  return i < steps / 2 ? step * float(i) : end - step * float(steps - 1 - i);
}

}  // namespace

PatchPlace patch_place(int64_t p, int64_t grid_w, int64_t merge) {
  const int64_t unit = merge * merge, blocks_per_row = grid_w / merge;
  const int64_t block = p / unit, in_block = p % unit;
  return {block / blocks_per_row * merge + in_block / merge,
          block % blocks_per_row * merge + in_block % merge};
}

void interpolate_positions(const float* table, int64_t side, int64_t hidden, int64_t grid_h,
                           int64_t grid_w, int64_t merge, float* out) {
  struct Axis {
    int64_t lo, hi;
    float frac;
  };
  auto axis = [&](int64_t steps) {
    std::vector<Axis> a(static_cast<size_t>(steps));
    for (int64_t i = 0; i < steps; ++i) {
      const float at = linspace_at(float(side - 1), steps, i);
      const int64_t lo = int64_t(at);
      a[size_t(i)] = {lo, std::min(lo + 1, side - 1), at - float(lo)};
    }
    return a;
  };
  const std::vector<Axis> rows = axis(grid_h), cols = axis(grid_w);
  for (int64_t p = 0; p < grid_h * grid_w; ++p) {
    const PatchPlace at = patch_place(p, grid_w, merge);
    const Axis& r = rows[size_t(at.row)];
    const Axis& c = cols[size_t(at.col)];
    const float weight[4] = {(1 - r.frac) * (1 - c.frac), (1 - r.frac) * c.frac,
                             r.frac * (1 - c.frac), r.frac * c.frac};
    const float* corner[4] = {table + (r.lo * side + c.lo) * hidden, table + (r.lo * side + c.hi) * hidden,
                              table + (r.hi * side + c.lo) * hidden, table + (r.hi * side + c.hi) * hidden};
    float* o = out + p * hidden;
    for (int64_t d = 0; d < hidden; ++d)
      o[d] = corner[0][d] * weight[0] + corner[1][d] * weight[1] + corner[2][d] * weight[2] +
             corner[3][d] * weight[3];
  }
}

void patch_rotary_angles(int64_t head_dim, int64_t grid_h, int64_t grid_w, int64_t merge,
                         float* cos, float* sin) {
  const int64_t quarter = head_dim / 4, half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(quarter));
  for (int64_t i = 0; i < quarter; ++i)
    inv_freq[size_t(i)] = 1.0f / std::pow(10000.0f, float(2 * i) / float(half));
  for (int64_t p = 0; p < grid_h * grid_w; ++p) {
    const PatchPlace at = patch_place(p, grid_w, merge);
    for (int64_t i = 0; i < quarter; ++i) {
      const float row_angle = float(at.row) * inv_freq[size_t(i)];
      const float col_angle = float(at.col) * inv_freq[size_t(i)];
      cos[p * half + i] = std::cos(row_angle);
      sin[p * half + i] = std::sin(row_angle);
      cos[p * half + quarter + i] = std::cos(col_angle);
      sin[p * half + quarter + i] = std::sin(col_angle);
    }
  }
}

}  // namespace ellm
