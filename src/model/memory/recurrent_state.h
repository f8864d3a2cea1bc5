#pragma once
// The recurrent state of the Gated DeltaNet layers of a hybrid model (Qwen3.5+), per slot and
// per recurrent layer, allocated once with the plan beside the KV of the full-attention layers:
//   conv window  [taps - 1][conv_dim]   the last inputs of the causal convolution (FP32)
//   S            [v_heads][dk][dv]      the delta-rule state (FP32)
// A slot's sequence state at n tokens is its KV rows below n plus this state after token n - 1.
// Its size does not depend on the sequence length. An architecture may keep sliding windows per
// slot after the layers' state (Qwen3.8-Flash-Next: each n-gram module's conv history and hash
// context): `windows` windows of window_rows rows (oldest first), into each of which a token
// pushes one row of window_row_floats values; zero in an empty sequence, copied in snapshots as
// one more range, and rolled back like the conv windows (state_rollback.h).
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "base/memory.h"

namespace ellm {

// The shape of the recurrent layers' state: how many layers, their conv taps and channels
// (q | k | v), and the delta rule's heads and head dims.
struct RecurrentShape {
  int64_t layers = 0, conv_taps = 0, conv_dim = 0, key_heads = 0, value_heads = 0, dk = 0, dv = 0;
  int64_t windows = 0, window_rows = 0, window_row_floats = 0;  // per slot, after the layers
  int64_t window_floats() const { return window_rows * window_row_floats; }
  int64_t extra_floats() const { return windows * window_floats(); }
};

class RecurrentState {
 public:
  RecurrentState() = default;
  RecurrentState(const RecurrentShape& shape, int64_t n_slots)
      : n_layers_(shape.layers),
        conv_floats_((shape.conv_taps - 1) * shape.conv_dim),
        s_floats_(shape.value_heads * shape.dk * shape.dv),
        extra_floats_(shape.extra_floats()),
        slot_floats_(n_layers_ * (conv_floats_ + s_floats_) + extra_floats_),
        data_(make_buffer<float>(size_t(n_slots * slot_floats_))) {}

  float* conv(int64_t layer, int64_t slot) const { return base(layer, slot); }
  float* S(int64_t layer, int64_t slot) const { return base(layer, slot) + conv_floats_; }
  // The same places in a snapshot: bytes_per_slot() bytes holding one slot's state as laid out
  // here (each layer's conv window, then its S).
  float* conv_in(uint8_t* snapshot, int64_t layer) const {
    return reinterpret_cast<float*>(snapshot) + layer * (conv_floats_ + s_floats_);
  }
  float* S_in(uint8_t* snapshot, int64_t layer) const { return conv_in(snapshot, layer) + conv_floats_; }
  // The extra values of a slot, and their place in a snapshot.
  float* extra(int64_t slot) const { return base(n_layers_, slot); }
  float* extra_in(uint8_t* snapshot) const { return conv_in(snapshot, n_layers_); }
  // A slot's state as one byte range per layer (then one for the extra values), in the order
  // of a snapshot.
  void ranges(int64_t slot, std::vector<std::span<uint8_t>>& out) const {
    for (int64_t l = 0; l < n_layers_; ++l)
      out.emplace_back(reinterpret_cast<uint8_t*>(base(l, slot)), size_t(conv_floats_ + s_floats_) * sizeof(float));
    if (extra_floats_ > 0)
      out.emplace_back(reinterpret_cast<uint8_t*>(extra(slot)), size_t(extra_floats_) * sizeof(float));
  }
  // The state of an empty sequence (all zeros), in every layer.
  void reset(int64_t slot) { std::fill_n(base(0, slot), slot_floats_, 0.0f); }
  size_t bytes_per_slot() const { return size_t(slot_floats_) * sizeof(float); }

 private:
  // Slot-major: one slot's state in all layers is one contiguous range.
  float* base(int64_t layer, int64_t slot) const {
    return data_.get() + slot * slot_floats_ + layer * (conv_floats_ + s_floats_);
  }
  int64_t n_layers_ = 0, conv_floats_ = 0, s_floats_ = 0, extra_floats_ = 0, slot_floats_ = 0;
  Buffer<float> data_;
};

}  // namespace ellm
