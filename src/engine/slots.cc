#include "engine/slots.h"

#include <algorithm>

#include "model/model.h"

namespace ellm {

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  size_t n = std::min(a.size(), b.size()), i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

SlotChoice choose_slot(std::span<const Slot> slots, std::span<const int32_t> prompt,
                       bool use_cache) {
  SlotChoice best;
  uint64_t best_used = 0;
  const int64_t reusable = int64_t(prompt.size()) - 1;
  for (const Slot& slot : slots) {
    if (slot.busy) continue;
    int64_t reuse = use_cache ? std::min<int64_t>(common_prefix(slot.tokens, prompt), reusable) : 0;
    bool better = best.slot < 0 || reuse > best.reuse ||
                  (reuse == best.reuse && slot.last_used < best_used);
    if (better) {
      best = {slot.index, reuse};
      best_used = slot.last_used;
    }
  }
  return best;
}

int64_t committed_positions(std::span<const Slot> slots, int except) {
  int64_t total = 0;
  for (const Slot& slot : slots)
    if (slot.index != except) total += std::max(slot.kv_high, slot.busy ? slot.reserved : 0);
  return total;
}

void evict(Slot& slot, Model& model) {
  slot.tokens.clear();  // first: if releasing fails, no request may reuse this KV
  if (slot.kv_high > 0) model.release_kv(slot.index, 0);
  slot.kv_high = 0;
}

bool make_room(std::span<Slot> slots, Model& model, int chosen, int64_t need, int64_t budget) {
  while (committed_positions(slots, chosen) + need > budget) {
    Slot* victim = nullptr;
    for (Slot& slot : slots)
      if (!slot.busy && slot.index != chosen && slot.kv_high > 0 &&
          (!victim || slot.last_used < victim->last_used))
        victim = &slot;
    if (!victim) return false;
    evict(*victim, model);
  }
  return true;
}

}  // namespace ellm
