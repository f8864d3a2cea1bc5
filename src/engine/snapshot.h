#pragma once
// Snapshots of a hybrid model's recurrent state (Model::state_ranges). The state folds in the
// whole prefix, so a session of a hybrid model resumes only where it holds a snapshot, with the
// KV rows below it. Passes take them (BatchToken::snapshot) where a continuation is
// likely to start: the end of each request, the end of a prefix shared with another session,
// and every --state-snapshot-interval positions of a long prompt.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace ellm {

struct StateSnapshot {
  int64_t position = 0;              // the state after tokens [0, position)
  std::shared_ptr<uint8_t[]> state;  // Model::state_bytes_per_slot() bytes; null while only on disk
  bool shared = false;               // where another session's prefix ends: kept while the session lives
};

// A buffer for one snapshot of `bytes` bytes.
std::shared_ptr<uint8_t[]> new_state_buffer(size_t bytes);

// The snapshot furthest along at or before `limit` (snapshots sorted by position); null: none.
const StateSnapshot* snapshot_at_or_before(std::span<const StateSnapshot> snapshots, int64_t limit);

// Adds a snapshot, keeping the list sorted with one per position.
void add_snapshot(std::vector<StateSnapshot>& snapshots, StateSnapshot snapshot);

// What a session keeps of its snapshots, so that they cost a bounded share of its KV: the two
// furthest along (where its next turn, or a retry of its last one, resumes), every shared one,
// and of the others the furthest along in each `interval` of positions.
void thin_snapshots(std::vector<StateSnapshot>& snapshots, int64_t interval);

}  // namespace ellm
