#pragma once
// Slots. A slot is one row of the model's static KV cache, where a sequence decodes; after a
// request ends it keeps the tokens whose KV it wrote (a hot session) until the slot is needed.
// Which slot a request takes, and what the choice costs, is decided here; the scheduler loop
// (scheduler/) only asks. Sessions that leave a slot go to the session store.
#include <cstdint>
#include <span>
#include <vector>

#include "engine/snapshot.h"

namespace ellm {

struct Slot {
  int index = 0;
  std::vector<int32_t> tokens;  // tokens whose KV is written, at positions 0 .. size-1
  int64_t prompt_len = 0;       // of the request that last ran here: what its client resends
  int64_t kv_high = 0;          // positions whose KV pages may be resident (>= tokens.size())
  int64_t reserved = 0;         // positions its running request may reach; 0 when idle
  uint64_t last_used = 0;       // LRU clock of the last admission or finish
  bool busy = false;            // running a request, or having its prefix restored
  // Hybrid models: snapshots of the state inside tokens (taken by passes, or brought along
  // from the store), and where the model's live state ends (Model::state_end, -1: not valid).
  std::vector<StateSnapshot> snapshots;
  int64_t state_end = -1;
};

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b);

struct SlotMatch {
  int slot = -1;       // -1: no slot shares a prefix
  int64_t tokens = 0;  // positions of that slot's KV the prompt can reuse
  int64_t common = 0;  // the longest prefix of the prompt any slot holds, resumable or not
};

// Where a slot can resume a prompt sharing `common` of its tokens: there, or for a hybrid model
// at its furthest snapshot within them (its live state, when that ends there, is one too).
int64_t resumable(const Slot& slot, int64_t common, bool hybrid);

// The slot, idle or busy, holding the longest resumable prefix of the prompt, at most
// max_tokens of it. A busy slot's rows below its written tokens never change, so they may be
// copied (between passes, so may its live state).
SlotMatch best_slot_match(std::span<const Slot> slots, std::span<const int32_t> prompt,
                          int64_t max_tokens, bool hybrid);

// Prompt tokens of a slot's session that keeping only `keep` positions would lose: what its
// client would send again.
int64_t tokens_lost(const Slot& slot, int64_t keep);

// Whether those lost tokens are worth copying the whole session out to the store. Copying a
// position's KV costs two orders of magnitude less than computing it, so a session is saved
// when it would lose more than 1/256 of its length (and a few tokens at least).
bool worth_saving(const Slot& slot, int64_t keep);

// The idle slot for a request whose first `reuse` positions come from slot `source` (-1: from
// the store, or nothing), chosen by what it costs in KV rows copied: the source itself when
// idle (nothing to copy in; its session saved first if worth it), else the slot that needs the
// least copying out (an empty one, or one whose session is not worth saving), least recently
// used among equals. -1 when no slot is idle.
int choose_slot(std::span<const Slot> slots, int source, int64_t reuse);

// Positions committed by all slots but `except`: a busy slot counts what it reserved, an idle
// one the pages it still holds; each snapshot a slot holds counts as `snapshot_positions`.
int64_t committed_positions(std::span<const Slot> slots, int except, int64_t snapshot_positions);

}  // namespace ellm
