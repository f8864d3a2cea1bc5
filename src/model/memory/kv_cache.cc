#include "model/memory/kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

namespace ellm {

KvCache::KvCache(int64_t n_layers, int64_t n_slots, int64_t n_kv_heads, int64_t max_positions,
                 int64_t head_dim, int64_t extra_floats, KvDtype dtype)
    : n_slots_(n_slots), n_kv_heads_(n_kv_heads), max_positions_(max_positions),
      head_dim_(head_dim), dtype_(dtype), extra_floats_(extra_floats) {
  const size_t huge = VirtualRegion::kHugePage;
  slot_bytes_ = (size_t(max_positions) * row_bytes() + huge - 1) / huge * huge;
  written_.assign(size_t(n_slots), 0);
  committed_.assign(size_t(n_slots), 0);
  layers_.reserve(size_t(n_layers));
  for (int64_t l = 0; l < n_layers; ++l)
    layers_.emplace_back(2 * size_t(n_slots) * slot_bytes_, /*huge_pages=*/true);
  if (extra_floats_ > 0) {
    extra_slot_bytes_ = (size_t(max_positions) * extra_row_bytes() + huge - 1) / huge * huge;
    extra_.reserve(size_t(n_layers));
    for (int64_t l = 0; l < n_layers; ++l)
      extra_.emplace_back(size_t(n_slots) * extra_slot_bytes_, /*huge_pages=*/true);
  }
}

void KvCache::commit(int64_t slot, int64_t end_position, ThreadTeam& team) {
  // Commit to the end of the huge page holding end_position - 1: that page is resident anyway
  // (with transparent huge pages), and decode makes one call per layer and K/V every 512
  // positions of Qwen3's 4 KiB rows, not every few.
  int64_t from = committed_[slot];
  if (end_position <= from) return;
  const size_t huge = VirtualRegion::kHugePage;
  size_t to_bytes = (size_t(end_position) * row_bytes() + huge - 1) / huge * huge;
  int64_t to = std::min(max_positions_, int64_t((to_bytes + row_bytes() - 1) / row_bytes()));
  int64_t ranges = int64_t(layers_.size()) * 2;  // (layer, K or V)
  team.run([&](int member, int n_members) {
    auto [begin, end] = split_range(ranges, member, n_members);
    for (int64_t i = begin; i < end; ++i)
      layers_[i / 2].commit(slot_offset(slot, int(i % 2)) + size_t(from) * row_bytes(),
                            size_t(to - from) * row_bytes());
  });
  for (VirtualRegion& region : extra_)
    region.commit(size_t(slot) * extra_slot_bytes_ + size_t(from) * extra_row_bytes(),
                  size_t(to - from) * extra_row_bytes());
  committed_[slot] = to;
}

void KvCache::ranges(int64_t slot, int64_t begin, int64_t end,
                     std::vector<std::span<uint8_t>>& out) const {
  for (const VirtualRegion& region : layers_)
    for (int kv = 0; kv < 2; ++kv)
      out.emplace_back(region.data() + slot_offset(slot, kv) + size_t(begin) * row_bytes(),
                       size_t(end - begin) * row_bytes());
  for (const VirtualRegion& region : extra_)
    out.emplace_back(region.data() + size_t(slot) * extra_slot_bytes_ + size_t(begin) * extra_row_bytes(),
                     size_t(end - begin) * extra_row_bytes());
}

void KvCache::release(int64_t slot, int64_t from_position) {
  if (from_position >= max_positions_) return;
  from_position = std::max<int64_t>(from_position, 0);
  written_[slot] = std::min(written_[slot], from_position);
  committed_[slot] = std::min(committed_[slot], from_position);
  size_t from = size_t(from_position) * row_bytes();
  for (VirtualRegion& region : layers_)
    for (int kv = 0; kv < 2; ++kv) region.release(slot_offset(slot, kv) + from, slot_bytes_ - from);
  const size_t extra_from = size_t(from_position) * extra_row_bytes();
  for (VirtualRegion& region : extra_)
    region.release(size_t(slot) * extra_slot_bytes_ + extra_from, extra_slot_bytes_ - extra_from);
}

size_t KvCache::resident_bytes() const {
  // mincore over the used prefix of each slot only (the reservation may be hundreds of GiB),
  // to the end of its last huge page: that page is resident as a whole.
  const size_t page = size_t(sysconf(_SC_PAGESIZE)), huge = VirtualRegion::kHugePage;
  std::vector<unsigned char> vec;
  size_t resident_pages = 0;
  for (const VirtualRegion& region : layers_)
    for (int kv = 0; kv < 2; ++kv)
      for (int64_t slot = 0; slot < n_slots_; ++slot) {
        size_t used = size_t(std::max(written_[slot], committed_[slot])) * row_bytes();
        if (used == 0) continue;
        used = std::min(slot_bytes_, (used + huge - 1) / huge * huge);
        size_t begin = slot_offset(slot, kv);  // a multiple of the page size
        size_t pages = (used + page - 1) / page;
        vec.resize(pages);
        if (mincore(region.data() + begin, pages * page, vec.data()) != 0) continue;
        for (size_t i = 0; i < pages; ++i) resident_pages += vec[i] & 1;
      }
  return resident_pages * page;
}

size_t KvCache::bytes_per_token() const {
  return layers_.size() * 2 * row_bytes() + extra_.size() * extra_row_bytes();
}

size_t KvCache::reserved_bytes() const {
  size_t total = 0;
  for (const VirtualRegion& region : layers_) total += region.size();
  for (const VirtualRegion& region : extra_) total += region.size();
  return total;
}

}  // namespace ellm
