#pragma once
// A read-only table left where the checkpoint's mapping puts it (Qwen3.8-Flash-Next's n-gram
// embedding: 95 GiB in BF16, of which a token reads 16 rows). Nothing copies it; this tracks
// what it costs: how much of it is resident, pinning it (mlock), reading ahead the rows a pass
// will gather so a cold table's page faults overlap instead of coming one at a time, and the
// page faults taken while gathering.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ellm {

class MappedFile;

struct MappedTableStatus {
  size_t bytes = 0, resident_bytes = 0;
  bool locked = false;
  // Tokens whose rows were gathered, and the page faults their gathering took.
  uint64_t gathered_tokens = 0, major_faults = 0, minor_faults = 0;
};

class MappedTable {
 public:
  MappedTable() = default;
  MappedTable(const MappedTable&) = delete;
  MappedTable& operator=(const MappedTable&) = delete;

  // One piece of the table: `bytes` at `data`, inside `file`'s mapping. Rows are read at
  // random, so the kernel's read-around of 128 KiB per fault is turned off for it.
  void add(const uint8_t* data, size_t bytes, const MappedFile& file);
  size_t bytes() const { return bytes_; }
  // mlock: every page read in and pinned. Throws Error with the reason and the way to allow it.
  void lock();
  // The pages of the rows about to be gathered, read ahead at once (MADV_WILLNEED): the kernel
  // issues the reads together. `scratch` holds 2 `count` values.
  void read_ahead(const uint8_t* const* rows, size_t count, size_t row_bytes, uintptr_t* scratch) const;
  // Counts a gather of `tokens` tokens that took these page faults (see FaultCounter).
  void count_gather(uint64_t tokens, uint64_t major, uint64_t minor) const;
  MappedTableStatus status() const;  // resident share by mincore: a system call per 1 GiB
  // Drops the table's pages from this process and, where no one else maps them, from the page
  // cache: the next reads come from the disk, as after a restart (the benchmark's cold table).
  void evict() const;

 private:
  struct Piece {
    const uint8_t* data;
    size_t bytes;
    std::string path;
    size_t file_offset;
  };
  std::vector<Piece> pieces_;
  size_t bytes_ = 0;
  bool locked_ = false;
  mutable std::atomic<uint64_t> tokens_{0}, major_{0}, minor_{0};
};

// The calling thread's page faults since construction (getrusage RUSAGE_THREAD).
class FaultCounter {
 public:
  FaultCounter();
  void add_to(const MappedTable& table, uint64_t tokens) const;

 private:
  long major_, minor_;
};

}  // namespace ellm
