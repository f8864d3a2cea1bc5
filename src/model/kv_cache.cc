#include "model/kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

namespace ellm {

KvCache::KvCache(int64_t n_layers, int64_t n_slots, int64_t n_kv_heads, int64_t max_positions,
                 int64_t head_dim)
    : n_slots_(n_slots), n_kv_heads_(n_kv_heads), max_positions_(max_positions),
      head_dim_(head_dim) {
  size_t layer_bytes = size_t(2 * n_slots * n_kv_heads) * size_t(head_stride()) * sizeof(float);
  written_.assign(size_t(n_slots), 0);
  layers_.reserve(size_t(n_layers));
  for (int64_t l = 0; l < n_layers; ++l) layers_.emplace_back(layer_bytes);
}

void KvCache::release(int64_t slot, int64_t from_position) {
  if (from_position >= max_positions_) return;
  written_[slot] = std::min(written_[slot], std::max<int64_t>(from_position, 0));
  size_t head_bytes = size_t(head_stride()) * sizeof(float);
  size_t from = size_t(from_position * head_dim_) * sizeof(float);
  for (VirtualRegion& region : layers_)
    for (int kv = 0; kv < 2; ++kv)
      for (int64_t h = 0; h < n_kv_heads_; ++h) {
        size_t head = size_t((kv * n_slots_ + slot) * n_kv_heads_ + h) * head_bytes;
        region.release(head + from, head_bytes - from);
      }
}

size_t KvCache::resident_bytes() const {
  // mincore over the written prefix of each head only: the reservation may be hundreds of GiB.
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  size_t head_bytes = size_t(head_stride()) * sizeof(float);
  std::vector<unsigned char> vec;
  size_t resident_pages = 0;
  for (const VirtualRegion& region : layers_)
    for (int kv = 0; kv < 2; ++kv)
      for (int64_t slot = 0; slot < n_slots_; ++slot) {
        size_t used = size_t(written_[slot] * head_dim_) * sizeof(float);
        if (used == 0) continue;
        for (int64_t h = 0; h < n_kv_heads_; ++h) {
          size_t begin = size_t((kv * n_slots_ + slot) * n_kv_heads_ + h) * head_bytes;
          size_t first = begin / page * page, end = begin + used;
          size_t pages = (end - first + page - 1) / page;
          vec.resize(pages);
          if (mincore(region.data() + first, pages * page, vec.data()) != 0) continue;
          for (size_t i = 0; i < pages; ++i) resident_pages += vec[i] & 1;
        }
      }
  return resident_pages * page;
}

size_t KvCache::bytes_per_token() const {
  return layers_.size() * 2 * size_t(n_kv_heads_ * head_dim_) * sizeof(float);
}

size_t KvCache::reserved_bytes() const {
  size_t total = 0;
  for (const VirtualRegion& region : layers_) total += region.size();
  return total;
}

}  // namespace ellm
