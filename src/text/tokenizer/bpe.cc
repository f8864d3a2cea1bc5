#include "text/tokenizer/bpe.h"

#include <algorithm>
#include <climits>
#include <functional>
#include <queue>

namespace ellm {
namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return uint64_t(uint32_t(left)) << 32 | uint32_t(right);
}

size_t hash_key(uint64_t key) { return (key * 0x9E3779B97F4A7C15ull) >> 20; }

// At most 3/4 full: a lookup stays within a cache line or two, and the table (16 bytes a
// slot, 4 MiB for Qwen's 151k merges) stays small enough to mostly live in cache.
bool too_full(size_t count, size_t slots) { return count * 4 > slots * 3; }

}  // namespace

void BpeMerges::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(std::max<size_t>(64, old.size() * 2), Slot{kEmpty, {}});
  count_ = 0;
  for (const Slot& s : old)
    if (s.key != kEmpty) add(int32_t(s.key >> 32), int32_t(uint32_t(s.key)), s.merge.merged, s.merge.rank);
}

void BpeMerges::reserve(size_t merges) {
  while (too_full(merges, slots_.size())) grow();
}

void BpeMerges::add(int32_t left, int32_t right, int32_t merged, int32_t rank) {
  if (too_full(count_ + 1, slots_.size())) grow();
  uint64_t key = pair_key(left, right);
  size_t mask = slots_.size() - 1;
  for (size_t i = hash_key(key) & mask;; i = (i + 1) & mask) {
    if (slots_[i].key == key) return;
    if (slots_[i].key == kEmpty) {
      slots_[i] = Slot{key, {rank, merged}};
      ++count_;
      return;
    }
  }
}

const BpeMerges::Merge* BpeMerges::find(int32_t left, int32_t right) const {
  if (slots_.empty()) return nullptr;
  uint64_t key = pair_key(left, right);
  size_t mask = slots_.size() - 1;
  for (size_t i = hash_key(key) & mask;; i = (i + 1) & mask) {
    if (slots_[i].key == key) return &slots_[i].merge;
    if (slots_[i].key == kEmpty) return nullptr;
  }
}

size_t BpeMerges::merge_by_scan(int32_t* ids, size_t length) const {
  constexpr int32_t kNone = INT32_MAX;
  int32_t rank[kShortWord];  // rank[i]: merge rank of the pair (ids[i], ids[i + 1])
  int n = static_cast<int>(length);
  auto rank_at = [&](int i) {
    const Merge* m = find(ids[i], ids[i + 1]);
    return m ? m->rank : kNone;
  };
  for (int i = 0; i + 1 < n; ++i) rank[i] = rank_at(i);
  while (n > 1) {
    int best = 0;
    for (int i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == kNone) break;
    ids[best] = find(ids[best], ids[best + 1])->merged;
    for (int i = best + 1; i + 1 < n; ++i) ids[i] = ids[i + 1];
    for (int i = best + 1; i + 2 < n; ++i) rank[i] = rank[i + 1];
    --n;
    if (best > 0) rank[best - 1] = rank_at(best - 1);
    if (best + 1 < n) rank[best] = rank_at(best);
  }
  return n;
}

size_t BpeMerges::merge_by_heap(int32_t* ids, size_t length) const {
  const int n = static_cast<int>(length);
  if (n < 2) return length;
  // Symbols form a doubly linked list over the original positions; a merge keeps the left
  // position, so (rank, position) orders candidates exactly like "lowest rank, leftmost".
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  struct Candidate {
    int32_t rank;
    int pos;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const Merge* m = find(ids[pos], ids[next[pos]])) heap.push({m->rank, pos});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);

  constexpr int32_t kGone = -1;
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    int right = next[c.pos];
    if (ids[c.pos] == kGone || right < 0) continue;
    const Merge* m = find(ids[c.pos], ids[right]);
    if (!m || m->rank != c.rank) continue;  // stale: a neighbour changed since it was queued
    ids[c.pos] = m->merged;
    ids[right] = kGone;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    consider(prev[c.pos]);
    consider(c.pos);
  }
  return std::remove(ids, ids + n, kGone) - ids;
}

}  // namespace ellm
