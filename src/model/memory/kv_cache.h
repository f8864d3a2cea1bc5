#pragma once
// The static KV cache (docs/design.md): per layer one virtual reservation holding
//   K [slot][position][kv_head][head_dim]  then  V [slot][position][kv_head][head_dim]
// in the dtype of --kv-cache-dtype (kernels/kv_dtype.h). FP16, the default: half the bytes FP32
// would take, which is what decode attention streams per token; 8x finer than BF16, and writes
// saturate at +-65504, so a large value cannot become infinity. BF16: FP32's range. FP8 E4M3:
// half again, each position's row ending in its heads' factors (docs/kv_cache_dtype.md).
// One position of a slot is one contiguous row of all its heads, exactly as the QKV projection
// produces it, so a slot's cache grows as one contiguous range per layer: attention streams
// positions in order (head h at offset h * head_dim, rows kv_row_stride apart), and the range
// commits in 2 MiB huge pages. Pages commit as positions are written; a huge sequence_length
// costs address space only.
// An architecture may keep `extra_floats` FP32 values per position beside K and V in every layer
// (Qwen3.8-Flash-Next: the QSA indexer's raw key and its block key): a third range per layer,
// [slot][position][extra_floats], copied and released with the rows.
#include <cstdint>
#include <span>
#include <vector>

#include "base/memory.h"
#include "base/threads.h"
#include "kernels/kernels.h"

namespace ellm {

class KvCache {
 public:
  KvCache() = default;
  KvCache(int64_t n_layers, int64_t n_slots, int64_t n_kv_heads, int64_t max_positions,
          int64_t head_dim, int64_t extra_floats = 0, KvDtype dtype = KvDtype::f16);

  // Position 0, head 0 of a slot's K (or V) for a layer: [max_positions] rows of row_bytes().
  uint8_t* k(int64_t layer, int64_t slot) const { return base(layer, slot, 0); }
  uint8_t* v(int64_t layer, int64_t slot) const { return base(layer, slot, 1); }
  uint8_t* k_row(int64_t layer, int64_t slot, int64_t position) const {
    return k(layer, slot) + size_t(position) * row_bytes();
  }
  uint8_t* v_row(int64_t layer, int64_t slot, int64_t position) const {
    return v(layer, slot) + size_t(position) * row_bytes();
  }
  KvDtype dtype() const { return dtype_; }
  // Elements of the dtype per position (bytes for FP8, its factors included), and bytes.
  int64_t row_stride() const { return kv_row_elements(dtype_, n_kv_heads_, head_dim_); }
  int64_t max_positions() const { return max_positions_; }
  size_t row_bytes() const { return kv_row_bytes(dtype_, n_kv_heads_, head_dim_); }
  // Position 0 of a slot's extra values for a layer: [max_positions][extra_floats()].
  float* extra(int64_t layer, int64_t slot) const {
    return reinterpret_cast<float*>(extra_[layer].data() + size_t(slot) * extra_slot_bytes_);
  }
  int64_t extra_floats() const { return extra_floats_; }

  // Records that a slot's positions below end_position have been written (bounds the resident
  // scan; the forward pass calls it).
  void note_written(int64_t slot, int64_t end_position) {
    if (end_position > written_[slot]) written_[slot] = end_position;
  }
  // Faults in the pages for a slot's positions below end_position (and on to the end of that
  // huge page) before a pass writes them: one system call per layer and K/V, split over the
  // team, instead of a page fault per page. Positions already committed cost nothing.
  void commit(int64_t slot, int64_t end_position, ThreadTeam& team);
  // Appends the byte ranges of a slot's positions [begin, end): per layer K, then V (then the
  // extra values, when there are any).
  void ranges(int64_t slot, int64_t begin, int64_t end, std::vector<std::span<uint8_t>>& out) const;
  // Returns the pages of a slot's positions [from_position, max_positions) to the OS.
  void release(int64_t slot, int64_t from_position);
  size_t resident_bytes() const;
  size_t bytes_per_token() const;  // K+V over all layers for one position of one slot
  size_t reserved_bytes() const;

 private:
  size_t extra_row_bytes() const { return size_t(extra_floats_) * sizeof(float); }
  size_t slot_offset(int64_t slot, int kv) const {  // bytes from the start of a layer
    return size_t(kv * n_slots_ + slot) * slot_bytes_;
  }
  uint8_t* base(int64_t layer, int64_t slot, int kv) const {
    return layers_[layer].data() + slot_offset(slot, kv);
  }
  int64_t n_slots_ = 0, n_kv_heads_ = 0, max_positions_ = 0, head_dim_ = 0;
  KvDtype dtype_ = KvDtype::f16;
  size_t slot_bytes_ = 0;  // one slot's K (or V) in a layer, rounded up to whole huge pages
  std::vector<VirtualRegion> layers_;
  int64_t extra_floats_ = 0;
  size_t extra_slot_bytes_ = 0;        // one slot's extra values in a layer, whole huge pages
  std::vector<VirtualRegion> extra_;  // per layer: [slot][max_positions][extra_floats]
  std::vector<int64_t> written_;    // per slot: positions below this may be resident
  std::vector<int64_t> committed_;  // per slot: positions below this are committed
};

}  // namespace ellm
