#pragma once
// Slots and the session cache. A slot is one row of the model's static KV cache; after a
// request ends it keeps the tokens whose KV it wrote, so a later prompt that starts with them
// prefills only the rest. Choosing a slot and keeping committed KV inside the memory budget
// live here; the scheduler loop (scheduler.cc) only asks.
#include <cstdint>
#include <span>
#include <vector>

namespace ellm {

class Model;

struct Slot {
  int index = 0;
  std::vector<int32_t> tokens;  // tokens whose KV is written, at positions 0 .. size-1
  int64_t kv_high = 0;          // positions whose KV pages may be resident (>= tokens.size())
  int64_t reserved = 0;         // positions its running request may reach; 0 when idle
  uint64_t last_used = 0;       // LRU clock of the last admission or finish
  bool busy = false;
};

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b);

struct SlotChoice {
  int slot = -1;      // -1: no idle slot
  int64_t reuse = 0;  // prompt tokens whose KV the slot already holds
};

// The idle slot whose cached tokens share the longest prefix with the prompt (least recently
// used among equals, so empty slots go before warm ones), at most prompt.size()-1 tokens reused
// so the last prompt token is always computed for its logits. Without the cache: the LRU slot.
SlotChoice choose_slot(std::span<const Slot> slots, std::span<const int32_t> prompt,
                       bool use_cache);

// Positions committed by all slots but `except`: a busy slot counts what it reserved, an idle
// one the pages it still holds.
int64_t committed_positions(std::span<const Slot> slots, int except);

// Drops a slot's session and gives its KV pages back.
void evict(Slot& slot, Model& model);

// Evicts idle sessions other than `chosen`, least recently used first, until `need` more
// positions fit under `budget`. Returns whether they fit.
bool make_room(std::span<Slot> slots, Model& model, int chosen, int64_t need, int64_t budget);

}  // namespace ellm
