#pragma once
// The static KV cache (DESIGN.md idea 2): per layer one virtual reservation holding
//   K [slot][kv_head][position][head_dim]  then  V [slot][kv_head][position][head_dim]  (FP32),
// contiguous along position so attention streams each head linearly. Pages commit as positions
// are written; a huge sequence_length costs address space only.
#include <cstdint>
#include <vector>

#include "base/memory.h"

namespace ellm {

class KvCache {
 public:
  KvCache() = default;
  KvCache(int64_t n_layers, int64_t n_slots, int64_t n_kv_heads, int64_t max_positions,
          int64_t head_dim);

  // Start of a slot's K (or V) for a layer: [n_kv_heads][max_positions][head_dim].
  float* k(int64_t layer, int64_t slot) const { return base(layer, slot, 0); }
  float* v(int64_t layer, int64_t slot) const { return base(layer, slot, 1); }
  int64_t head_stride() const { return max_positions_ * head_dim_; }  // elements
  int64_t max_positions() const { return max_positions_; }

  // Records that a slot's positions below end_position have been written (bounds the resident
  // scan; the forward pass calls it).
  void note_written(int64_t slot, int64_t end_position) {
    if (end_position > written_[slot]) written_[slot] = end_position;
  }
  // Returns the pages of a slot's positions [from_position, max_positions) to the OS.
  void release(int64_t slot, int64_t from_position);
  size_t resident_bytes() const;
  size_t bytes_per_token() const;  // K+V over all layers for one position of one slot
  size_t reserved_bytes() const;

 private:
  float* base(int64_t layer, int64_t slot, int kv) const {
    float* p = reinterpret_cast<float*>(layers_[layer].data());
    return p + ((kv * n_slots_ + slot) * n_kv_heads_) * head_stride();
  }
  int64_t n_slots_ = 0, n_kv_heads_ = 0, max_positions_ = 0, head_dim_ = 0;
  std::vector<VirtualRegion> layers_;
  std::vector<int64_t> written_;  // per slot: positions below this may be resident
};

}  // namespace ellm
