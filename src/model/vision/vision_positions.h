#pragma once
// Where each patch of an image sits, as the tower sees it: patches come in merge-block order
// (block row, block column, row in the block, column in the block), and both the learned
// position rows and the 2-D rotary angles follow that order.
#include <cstdint>

namespace ellm {

// The row and column of patch p (in merge-block order) of a grid_h x grid_w frame.
struct PatchPlace {
  int64_t row, col;
};
PatchPlace patch_place(int64_t p, int64_t grid_w, int64_t merge);

// out [grid_h * grid_w][hidden]: the side x side learned table bilinearly interpolated to the
// grid (transformers' fast_pos_embed_interpolate: corners from a linspace over the side, the
// four corners' weights), rows in merge-block order.
void interpolate_positions(const float* table, int64_t side, int64_t hidden, int64_t grid_h,
                           int64_t grid_w, int64_t merge, float* out);

// cos, sin [grid_h * grid_w][head_dim / 2] in merge-block order: head_dim / 4 angles of the
// patch's row, then head_dim / 4 of its column, frequencies theta^(-4i / head_dim), theta 10000;
// rotate-half pairs (d, d + head_dim / 2) share angle d.
void patch_rotary_angles(int64_t head_dim, int64_t grid_h, int64_t grid_w, int64_t merge,
                         float* cos, float* sin);

}  // namespace ellm
