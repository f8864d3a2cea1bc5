#pragma once
// Byte-pair merging: the ranked merge table and the per-word merge loop.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ellm {

class BpeMerges {
 public:
  struct Merge {
    int32_t rank;    // lower merges first
    int32_t merged;  // token id of the merged pair
  };

  // Records that the pair (left, right) merges into `merged` with priority `rank`. The first
  // record of a pair wins (Hugging Face keeps the first rank too).
  void add(int32_t left, int32_t right, int32_t merged, int32_t rank);
  const Merge* find(int32_t left, int32_t right) const;
  size_t size() const { return count_; }
  void reserve(size_t merges);

  // Merges ids[0, n) in place until no adjacent pair has a merge: always the lowest-ranked
  // pair, leftmost on ties, exactly as the reference BPE does. Returns the new length.
  size_t apply(int32_t* ids, size_t n) const {
    return n <= kShortWord ? merge_by_scan(ids, n) : merge_by_heap(ids, n);
  }
  // The two strategies behind apply(), public so tests can check they agree.
  size_t merge_by_scan(int32_t* ids, size_t n) const;  // O(n^2), no allocation: short words
  size_t merge_by_heap(int32_t* ids, size_t n) const;  // O(n log n): long words

 private:
  struct Slot {
    uint64_t key;  // left << 32 | right; kEmpty when unused
    Merge merge;
  };
  static constexpr size_t kShortWord = 64;
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  void grow();

  std::vector<Slot> slots_;  // open addressing, linear probing, power-of-two size
  size_t count_ = 0;
};

}  // namespace ellm
