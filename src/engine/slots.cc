#include "engine/slots.h"

#include <algorithm>

namespace ellm {

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  size_t n = std::min(a.size(), b.size()), i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

int64_t resumable(const Slot& slot, int64_t common, bool hybrid) {
  if (!hybrid || common == 0) return common;
  if (common == int64_t(slot.tokens.size()) && slot.state_end == common) return common;
  const StateSnapshot* s = snapshot_at_or_before(slot.snapshots, common);
  return s ? s->position : 0;
}

SlotMatch best_slot_match(std::span<const Slot> slots, std::span<const int32_t> prompt,
                          int64_t max_tokens, bool hybrid) {
  SlotMatch best;
  for (const Slot& slot : slots) {
    const int64_t common = std::min<int64_t>(common_prefix(slot.tokens, prompt), max_tokens);
    const int64_t n = resumable(slot, common, hybrid);
    best.common = std::max(best.common, common);
    // Among equals an idle slot wins: the request may then take it without copying.
    bool better = n > best.tokens || (n == best.tokens && n > 0 && !slot.busy && slots[best.slot].busy);
    if (better) {
      best.slot = slot.index;
      best.tokens = n;
    }
  }
  return best;
}

int64_t tokens_lost(const Slot& slot, int64_t keep) {
  return std::max<int64_t>(0, std::min<int64_t>(slot.prompt_len, int64_t(slot.tokens.size())) - keep);
}

bool worth_saving(const Slot& slot, int64_t keep) {
  const int64_t lost = tokens_lost(slot, keep);
  return lost > 0 && lost >= std::max<int64_t>(8, int64_t(slot.tokens.size()) / 256);
}

int choose_slot(std::span<const Slot> slots, int source, int64_t reuse) {
  int best = -1;
  int64_t best_cost = 0;
  for (const Slot& slot : slots) {
    if (slot.busy) continue;
    const int64_t n = int64_t(slot.tokens.size());
    int64_t cost;
    if (slot.index == source)
      cost = worth_saving(slot, reuse) ? n : 0;
    else
      cost = reuse + (worth_saving(slot, 0) ? n : 0);
    bool better = best < 0 || cost < best_cost ||
                  (cost == best_cost && slot.last_used < slots[best].last_used);
    if (better) {
      best = slot.index;
      best_cost = cost;
    }
  }
  return best;
}

int64_t committed_positions(std::span<const Slot> slots, int except, int64_t snapshot_positions) {
  int64_t total = 0;
  for (const Slot& slot : slots)
    if (slot.index != except)
      total += std::max(slot.kv_high, slot.busy ? slot.reserved : 0) +
               int64_t(slot.snapshots.size()) * snapshot_positions;
  return total;
}

}  // namespace ellm
