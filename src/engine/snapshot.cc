#include "engine/snapshot.h"

#include <algorithm>

namespace ellm {

std::shared_ptr<uint8_t[]> new_state_buffer(size_t bytes) {
  return std::shared_ptr<uint8_t[]>(new uint8_t[bytes]);
}

const StateSnapshot* snapshot_at_or_before(std::span<const StateSnapshot> snapshots, int64_t limit) {
  auto after = std::upper_bound(snapshots.begin(), snapshots.end(), limit,
                                [](int64_t p, const StateSnapshot& s) { return p < s.position; });
  return after == snapshots.begin() ? nullptr : &*(after - 1);
}

void add_snapshot(std::vector<StateSnapshot>& snapshots, StateSnapshot snapshot) {
  auto at = std::lower_bound(snapshots.begin(), snapshots.end(), snapshot.position,
                             [](const StateSnapshot& s, int64_t p) { return s.position < p; });
  if (at != snapshots.end() && at->position == snapshot.position) {
    at->shared = at->shared || snapshot.shared;
    if (!at->state) at->state = std::move(snapshot.state);
    return;
  }
  snapshots.insert(at, std::move(snapshot));
}

void thin_snapshots(std::vector<StateSnapshot>& snapshots, int64_t interval) {
  if (interval <= 0) interval = INT64_MAX;
  std::vector<StateSnapshot> kept;
  int64_t window = -1;  // of the last one kept
  for (size_t i = snapshots.size(); i-- > 0;) {
    StateSnapshot& s = snapshots[i];
    const bool recent = snapshots.size() - i <= 2;
    const int64_t w = s.position / interval;
    if (recent || s.shared || w != window) {
      window = w;
      kept.push_back(std::move(s));
    }
  }
  std::reverse(kept.begin(), kept.end());
  snapshots = std::move(kept);
}

}  // namespace ellm
