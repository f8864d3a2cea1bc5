#include "model/memory/state_rollback.h"

#include <cmath>
#include <cstring>

#include "kernels/kernels.h"

namespace ellm {

StateRollback::StateRollback(const RecurrentShape& shape, int64_t n_slots, int64_t max_tokens)
    : shape_(shape),
      max_tokens_(max_tokens),
      row_floats_(2 * shape.conv_dim + 2 * shape.value_heads),
      state_floats_(shape.layers * ((shape.conv_taps - 1) * shape.conv_dim +
                                    shape.value_heads * shape.dk * shape.dv) +
                    shape.extra_floats()) {
  const size_t saved = size_t(n_slots * state_floats_);
  const size_t inputs = size_t(n_slots * shape.layers * max_tokens * row_floats_);
  const size_t rows = size_t(n_slots * shape.windows * max_tokens * shape.window_row_floats);
  saved_ = make_buffer<float>(saved);
  inputs_ = make_buffer<float>(inputs);
  rows_ = make_buffer<float>(rows);
  bytes_ = (saved + inputs + rows) * sizeof(float);
}

// RecurrentState keeps a slot's state in all layers (then its windows) as one range, starting at
// layer 0's conv window.
void StateRollback::save(const RecurrentState& state, int64_t slot) {
  std::memcpy(saved_.get() + slot * state_floats_, state.conv(0, slot), size_t(state_floats_) * sizeof(float));
}

void StateRollback::restore(RecurrentState& state, int64_t slot, int64_t keep, ThreadTeam& team) const {
  const RecurrentShape& g = shape_;
  const int64_t window_floats = (g.conv_taps - 1) * g.conv_dim, s_floats = g.dk * g.dv;
  const int64_t layer_floats = window_floats + g.value_heads * s_floats;
  const int64_t group = g.value_heads / g.key_heads, Hk = g.key_heads;
  const float* saved = saved_.get() + slot * state_floats_;
  // Work items: per layer, its conv window, then one per value head; then the sliding windows.
  const int64_t per_layer = 1 + g.value_heads;
  team.run([&](int member, int n_members) {
    auto [i0, i1] = split_range(g.layers * per_layer + g.windows, member, n_members);
    alignas(64) float out[kMaxDeltaHeadDim];
    for (int64_t item = i0; item < i1; ++item) {
      if (item >= g.layers * per_layer) {
        // Window w holds the last window_rows rows of [the saved window | the kept tokens' rows].
        const int64_t w = item - g.layers * per_layer, R = g.window_rows, F = g.window_row_floats;
        const float* saved_window = saved + g.layers * layer_floats + w * R * F;
        float* window = state.extra(slot) + w * R * F;
        for (int64_t r = 0; r < R; ++r) {
          const int64_t source = keep + r;
          const float* from = source < R ? saved_window + source * F : window_row(w, slot, source - R);
          std::memcpy(window + r * F, from, size_t(F) * sizeof(float));
        }
        continue;
      }
      const int64_t layer = item / per_layer, part = item % per_layer;
      const float* saved_layer = saved + layer * layer_floats;
      if (part == 0) {
        // The window holds the last taps - 1 conv inputs: of the saved window followed by the
        // kept tokens' inputs.
        float* window = state.conv(layer, slot);
        for (int64_t r = 0; r < g.conv_taps - 1; ++r) {
          const int64_t source = keep + r;  // in [saved window rows | kept inputs]
          const float* from = source < g.conv_taps - 1
                                  ? saved_layer + source * g.conv_dim
                                  : conv_input(layer, slot, source - (g.conv_taps - 1));
          std::memcpy(window + r * g.conv_dim, from, size_t(g.conv_dim) * sizeof(float));
        }
        continue;
      }
      // The delta rule of value head j: the saved S, then the kept tokens' steps.
      const int64_t j = part - 1, i = j / group;
      float* S = state.S(layer, slot) + j * s_floats;
      std::memcpy(S, saved_layer + window_floats + j * s_floats, size_t(s_floats) * sizeof(float));
      for (int64_t t = 0; t < keep; ++t) {
        const float* qkv = delta_qkv(layer, slot, t);
        gated_delta_step(S, g.dk, g.dv, qkv + i * g.dk, qkv + Hk * g.dk + i * g.dk,
                         qkv + 2 * Hk * g.dk + j * g.dv, std::exp(log_decay(layer, slot, t)[j]),
                         beta(layer, slot, t)[j], out);
      }
    }
  });
}

}  // namespace ellm
