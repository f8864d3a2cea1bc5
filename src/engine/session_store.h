#pragma once
// The session store (DESIGN.md idea 4): token sequences with their KV, kept after they leave
// the slots. Sessions live warm in RAM (a copy of their KV rows) and, with a directory, cold on
// disk (engine/session_file.h), which survives restarts and may be shared by replicas. The
// scheduler copies a session out of a slot it needs (put) and copies the best stored prefix of
// a new prompt into the slot it gives that prompt (find, restore).
//
// Matching: every session is indexed by the chained hashes of its 64-token blocks, so the
// longest stored prefix of a prompt is found by walking the prompt's blocks (a prefix tree at
// block granularity), then comparing tokens exactly. A session that another extends is dropped
// when the longer one is stored.
//
// Budgets: RAM sessions beyond the memory budget go to disk (least recently used first) on a
// writer thread, or are dropped without a directory; files beyond the disk budget are deleted.
// A failed write drops the session and is counted; serving goes on.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/session_file.h"

namespace ellm {

struct SessionStoreOptions {
  KvIdentity identity;
  size_t memory_bytes = 0;  // RAM tier budget
  std::string dir;          // disk tier; empty = none
  size_t disk_bytes = 0;    // disk tier budget
};

enum class SessionTier { hot, ram, disk };
const char* tier_name(SessionTier tier);

struct SessionTierMetrics {
  int64_t hits = 0, tokens = 0;         // restores and the prompt tokens they served
  int64_t bytes_in = 0, bytes_out = 0;  // KV copied into slots / into this tier
  double restore_seconds = 0;
  int64_t evictions = 0;                // sessions dropped from this tier by its budget
  int64_t failures = 0;                 // failed writes or restores (the session is dropped)
  int64_t sessions = 0, bytes = 0;      // held now
};

struct SessionMetrics {
  SessionTierMetrics hot, ram, disk;
};

struct SessionInfo {
  std::string id;
  SessionTier tier;
  int64_t tokens = 0, bytes = 0;
  double idle_seconds = 0;
};

struct StoredMatch {
  uint64_t id = 0;
  int64_t tokens = 0;  // common prefix with the prompt
  SessionTier tier = SessionTier::ram;
};

class SessionStore {
 public:
  static constexpr int64_t kBlock = 64;  // sessions shorter than a block are not kept

  explicit SessionStore(SessionStoreOptions options);  // scans the directory
  ~SessionStore();                                     // stops the writer (no flush)

  // The stored session sharing the longest prefix with prompt, at most max_tokens of it.
  StoredMatch find(std::span<const int32_t> prompt, int64_t max_tokens);
  // Copies the first `tokens` positions of a stored session into a slot. ranges_for(end, out)
  // gives the slot's KV ranges for positions [0, end), committed. Returns the positions
  // restored: `tokens`, or 0 when the session is gone or its file fails its checks (then it is
  // dropped). capacity bounds the positions a disk restore may write (it reads whole chunks).
  using RangesFor = std::function<void(int64_t end, std::vector<std::span<uint8_t>>& out)>;
  int64_t restore(const StoredMatch& match, int64_t capacity, const RangesFor& ranges_for);
  // Keeps a copy of a session whose KV is `ranges` (n_ranges spans of tokens.size() rows).
  // Nothing is copied when a stored session already holds these tokens (or more).
  void put(std::span<const int32_t> tokens, std::span<const std::span<const uint8_t>> ranges);
  // Writes every RAM session not yet on disk, until the deadline (shutdown).
  void flush(std::chrono::steady_clock::time_point deadline);

  std::vector<SessionInfo> list();
  int64_t drop_all();  // RAM copies and this store's files; returns the sessions dropped
  SessionMetrics metrics();
  // Hot hits are counted here too, so the metrics have one home.
  void count_hot_hit(int64_t tokens, int64_t bytes, double seconds);

 private:
  struct Entry {
    uint64_t id = 0;
    std::vector<int32_t> tokens;
    std::vector<uint64_t> blocks;       // chained hash of each whole block
    std::shared_ptr<uint8_t[]> ram;     // [n_ranges][tokens][row_bytes]; null when not in RAM
    std::string file;                   // file name in dir; empty when not on disk
    uint64_t file_bytes = 0;
    uint64_t last_used = 0;             // store clock: LRU order
    std::chrono::steady_clock::time_point used_at;
    bool queued = false;                // waiting for the writer
  };

  uint64_t entry_bytes(const Entry& e) const { return e.tokens.size() * options_.identity.bytes_per_token(); }
  std::vector<uint64_t> block_hashes(std::span<const int32_t> tokens) const;
  Entry* insert(std::vector<int32_t> tokens);
  void erase(uint64_t id, bool delete_file);
  void drop_ram(Entry& e);
  void make_ram_room(uint64_t bytes, std::unique_lock<std::mutex>& lock);
  void enforce_disk_budget();
  void rescan_locked();
  void writer_loop();
  std::vector<std::span<const uint8_t>> ram_ranges(const Entry& e, const uint8_t* blob) const;

  const SessionStoreOptions options_;
  std::mutex mutex_;
  std::condition_variable writer_wake_, written_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::unordered_map<uint64_t, std::vector<uint64_t>> index_;  // block hash -> entry ids
  std::unordered_map<std::string, uint64_t> files_;            // file name -> entry id
  std::deque<uint64_t> write_queue_;
  uint64_t next_id_ = 1, clock_ = 0;
  uint64_t ram_bytes_ = 0, disk_bytes_ = 0, queued_bytes_ = 0;
  int writing_ = 0;                                            // writes in flight
  std::unordered_map<std::string, bool> bad_files_;            // skipped once, never re-read
  int64_t dir_mtime_ns_ = -1;
  bool stopping_ = false;
  SessionMetrics metrics_;
  std::thread writer_;
};

}  // namespace ellm
