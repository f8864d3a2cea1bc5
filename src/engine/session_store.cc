#include "engine/session_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "base/error.h"
#include "base/hash.h"
#include "base/log.h"
#include "engine/slots.h"

namespace ellm {
namespace {

using SteadyClock = std::chrono::steady_clock;

bool starts_with(std::span<const int32_t> tokens, std::span<const int32_t> prefix) {
  return tokens.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), tokens.begin());
}

std::string hex_id(uint64_t id) {
  char text[20];
  std::snprintf(text, sizeof text, "%llx", static_cast<unsigned long long>(id));
  return text;
}

}  // namespace

const char* tier_name(SessionTier tier) {
  switch (tier) {
    case SessionTier::hot: return "hot";
    case SessionTier::ram: return "ram";
    case SessionTier::disk: return "disk";
  }
  return "?";
}

SessionStore::SessionStore(SessionStoreOptions options) : options_(std::move(options)) {
  if (!options_.dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options_.dir, ec);
    if (ec) fail("--session-dir " + options_.dir, "cannot create the directory: " + ec.message());
    if (::access(options_.dir.c_str(), W_OK) != 0)
      fail("--session-dir " + options_.dir, "the directory is not writable");
    std::lock_guard lock(mutex_);
    rescan_locked();
    if (!entries_.empty())
      log_info("sessions: " + std::to_string(entries_.size()) + " on disk in " + options_.dir);
    writer_ = std::thread([this] { writer_loop(); });
  }
}

SessionStore::~SessionStore() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  writer_wake_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::vector<uint64_t> SessionStore::block_hashes(std::span<const int32_t> tokens) const {
  std::vector<uint64_t> hashes;
  uint64_t h = options_.identity.fingerprint;
  for (size_t begin = 0; begin + kBlock <= tokens.size(); begin += kBlock) {
    h = hash_bytes(tokens.data() + begin, kBlock * sizeof(int32_t), h);
    hashes.push_back(h);
  }
  return hashes;
}

SessionStore::Entry* SessionStore::insert(std::vector<int32_t> tokens) {
  Entry entry;
  entry.id = next_id_++;
  entry.blocks = block_hashes(tokens);
  entry.tokens = std::move(tokens);
  entry.last_used = ++clock_;
  entry.used_at = SteadyClock::now();
  for (uint64_t h : entry.blocks) index_[h].push_back(entry.id);
  return &(entries_[entry.id] = std::move(entry));
}

void SessionStore::erase(uint64_t id, bool delete_file) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  for (uint64_t h : e.blocks) {
    auto ids = index_.find(h);
    if (ids == index_.end()) continue;
    std::erase(ids->second, id);
    if (ids->second.empty()) index_.erase(ids);
  }
  if (e.queued) queued_bytes_ -= entry_bytes(e);
  if (e.ram) ram_bytes_ -= entry_bytes(e);
  if (!e.file.empty()) {
    disk_bytes_ -= e.file_bytes;
    files_.erase(e.file);
    if (delete_file) ::unlink((options_.dir + "/" + e.file).c_str());
  }
  entries_.erase(it);
}

void SessionStore::drop_ram(Entry& e) {
  if (!e.ram) return;
  ram_bytes_ -= entry_bytes(e);
  e.ram.reset();
}

std::vector<std::span<const uint8_t>> SessionStore::ram_ranges(const Entry& e, const uint8_t* blob) const {
  std::vector<std::span<const uint8_t>> ranges;
  const size_t range_bytes = e.tokens.size() * options_.identity.row_bytes;
  for (uint64_t r = 0; r < options_.identity.n_ranges; ++r) ranges.emplace_back(blob + r * range_bytes, range_bytes);
  return ranges;
}

// Re-reads the directory when it changed (another server, or this one, wrote or removed files):
// a replica finds the sessions others stored without a restart.
void SessionStore::rescan_locked() {
  if (options_.dir.empty()) return;
  struct stat st {};
  if (::stat(options_.dir.c_str(), &st) != 0) return;
  const int64_t mtime = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (mtime == dir_mtime_ns_) return;
  dir_mtime_ns_ = mtime;
  std::error_code ec;
  std::vector<std::string> seen;
  for (const auto& item : std::filesystem::directory_iterator(options_.dir, ec)) {
    const std::string name = item.path().filename().string();
    if (item.path().extension() != ".kv" || name.front() == '.') continue;
    seen.push_back(name);
    if (files_.count(name) || bad_files_.count(name)) continue;
    std::string why;
    auto info = read_session_info(item.path().string(), options_.identity, why);
    if (!info) {
      log_warn("sessions: skipping " + item.path().string() + ": " + why);
      bad_files_[name] = true;
      continue;
    }
    Entry* e = insert(std::move(info->tokens));
    e->file = name;
    e->file_bytes = info->file_bytes;
    e->last_used = 0;  // older than anything used here
    files_[name] = e->id;
    disk_bytes_ += e->file_bytes;
  }
  // Files another server deleted: forget them unless a RAM copy remains.
  std::sort(seen.begin(), seen.end());
  std::vector<uint64_t> gone;
  for (const auto& [name, id] : files_)
    if (!std::binary_search(seen.begin(), seen.end(), name)) gone.push_back(id);
  for (uint64_t id : gone) {
    Entry& e = entries_.at(id);
    if (!e.ram && !e.queued) {
      erase(id, false);
    } else {
      files_.erase(e.file);
      disk_bytes_ -= e.file_bytes;
      e.file.clear();
      e.file_bytes = 0;
    }
  }
  enforce_disk_budget();
}

StoredMatch SessionStore::find(std::span<const int32_t> prompt, int64_t max_tokens) {
  std::lock_guard lock(mutex_);
  rescan_locked();
  const std::vector<uint64_t>* deepest = nullptr;
  uint64_t h = options_.identity.fingerprint;
  for (size_t begin = 0; begin + kBlock <= prompt.size(); begin += kBlock) {
    h = hash_bytes(prompt.data() + begin, kBlock * sizeof(int32_t), h);
    auto it = index_.find(h);
    if (it == index_.end()) break;
    deepest = &it->second;
  }
  StoredMatch best;
  if (!deepest) return best;
  uint64_t best_used = 0;
  for (uint64_t id : *deepest) {
    const Entry& e = entries_.at(id);
    int64_t n = std::min(int64_t(common_prefix(e.tokens, prompt)), max_tokens);
    SessionTier tier = e.ram ? SessionTier::ram : SessionTier::disk;
    bool better = n > best.tokens ||
                  (n == best.tokens && (tier < best.tier || (tier == best.tier && e.last_used > best_used)));
    if (better && n > 0) {
      best = {id, n, tier};
      best_used = e.last_used;
    }
  }
  return best;
}

int64_t SessionStore::restore(const StoredMatch& match, int64_t capacity, const RangesFor& ranges_for) {
  std::unique_lock lock(mutex_);
  auto it = entries_.find(match.id);
  if (it == entries_.end() || match.tokens <= 0) return 0;
  Entry& e = it->second;
  e.last_used = ++clock_;
  e.used_at = SteadyClock::now();
  const int64_t n = int64_t(e.tokens.size());
  int64_t tokens = std::min(match.tokens, n);
  const uint64_t row = options_.identity.row_bytes;
  std::vector<std::span<uint8_t>> dst;
  const auto start = SteadyClock::now();

  if (e.ram) {
    std::shared_ptr<uint8_t[]> blob = e.ram;  // stays valid if the entry goes meanwhile
    lock.unlock();
    ranges_for(tokens, dst);
    for (uint64_t r = 0; r < dst.size(); ++r)
      std::memcpy(dst[r].data(), blob.get() + r * n * row, size_t(tokens) * row);
    const double seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
    lock.lock();
    metrics_.ram.hits++;
    metrics_.ram.tokens += tokens;
    metrics_.ram.bytes_in += tokens * int64_t(options_.identity.bytes_per_token());
    metrics_.ram.restore_seconds += seconds;
    return tokens;
  }
  if (e.file.empty()) return 0;

  // A disk restore reads whole chunks: up to the chunk holding the last position, or the end.
  int64_t end = std::min(n, (tokens + kChunkPositions - 1) / kChunkPositions * kChunkPositions);
  if (end > capacity) {
    end = capacity / kChunkPositions * kChunkPositions;
    tokens = std::min(tokens, end);
    if (tokens <= 0) return 0;
  }
  const std::string name = e.file, path = options_.dir + "/" + name;
  lock.unlock();
  ranges_for(end, dst);
  std::string why;
  bool ok = read_session_kv(path, options_.identity, end, std::span<const std::span<uint8_t>>(dst), why);
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  lock.lock();
  if (!ok) {
    auto again = files_.find(name);
    if (again != files_.end()) erase(again->second, false);
    if (::access(path.c_str(), F_OK) != 0) return 0;  // replaced or dropped by another server
    log_warn("sessions: cannot restore " + path + ": " + why + "; computing the prompt instead");
    metrics_.disk.failures++;
    bad_files_[name] = true;
    return 0;
  }
  metrics_.disk.hits++;
  metrics_.disk.tokens += tokens;
  metrics_.disk.bytes_in += end * int64_t(options_.identity.bytes_per_token());
  metrics_.disk.restore_seconds += seconds;
  return tokens;
}

void SessionStore::put(std::span<const int32_t> tokens, std::span<const std::span<const uint8_t>> ranges) {
  const int64_t n = int64_t(tokens.size());
  if (n < kBlock || ranges.size() != options_.identity.n_ranges) return;
  std::unique_lock lock(mutex_);
  // Already held (the same tokens or an extension of them): only touch it.
  std::vector<uint64_t> chain = block_hashes(tokens);
  std::vector<uint64_t> related;
  for (uint64_t h : chain) {
    auto it = index_.find(h);
    if (it == index_.end()) break;
    related.insert(related.end(), it->second.begin(), it->second.end());
  }
  std::sort(related.begin(), related.end());
  related.erase(std::unique(related.begin(), related.end()), related.end());
  for (uint64_t id : related) {
    Entry& e = entries_.at(id);
    if (starts_with(e.tokens, tokens)) {
      e.last_used = ++clock_;
      e.used_at = SteadyClock::now();
      return;
    }
  }
  // Sessions this one extends are dropped: it serves every prompt they could.
  for (uint64_t id : related)
    if (starts_with(tokens, entries_.at(id).tokens)) erase(id, true);

  const uint64_t bytes = uint64_t(n) * options_.identity.bytes_per_token();
  if (bytes > options_.memory_bytes) {
    // Larger than the RAM tier: straight to disk from the slot, or not kept.
    if (options_.dir.empty()) {
      metrics_.ram.evictions++;
      return;
    }
    const std::string name = session_file_name(options_.identity, tokens);
    std::vector<int32_t> copy(tokens.begin(), tokens.end());
    ++writing_;
    lock.unlock();
    bool ok = true;
    try {
      write_session_file(options_.dir, name, options_.identity, copy, ranges);
    } catch (const std::exception& ex) {
      log_warn(std::string("sessions: ") + ex.what() + "; the session is dropped");
      ok = false;
    }
    lock.lock();
    --writing_;
    written_.notify_all();
    if (!ok) {
      metrics_.disk.failures++;
      metrics_.disk.evictions++;
      return;
    }
    if (auto old = files_.find(name); old != files_.end()) erase(old->second, false);
    Entry* e = insert(std::move(copy));
    e->file = name;
    e->file_bytes = bytes;  // close enough for the budget: the header is a few KiB
    files_[name] = e->id;
    disk_bytes_ += e->file_bytes;
    metrics_.disk.bytes_out += int64_t(bytes);
    enforce_disk_budget();
    return;
  }

  make_ram_room(bytes, lock);
  std::shared_ptr<uint8_t[]> blob(new uint8_t[bytes]);
  const size_t range_bytes = size_t(n) * options_.identity.row_bytes;
  for (size_t r = 0; r < ranges.size(); ++r) std::memcpy(blob.get() + r * range_bytes, ranges[r].data(), range_bytes);
  Entry* e = insert(std::vector<int32_t>(tokens.begin(), tokens.end()));
  e->ram = std::move(blob);
  ram_bytes_ += bytes;
  metrics_.ram.bytes_out += int64_t(bytes);
}

// Frees RAM for `bytes` more: least recently used sessions go to disk (on the writer thread) or,
// without a directory, are dropped. Sessions waiting for the writer still hold their RAM; past
// a quarter over budget this waits for the writer, so RAM stays bounded.
void SessionStore::make_ram_room(uint64_t bytes, std::unique_lock<std::mutex>& lock) {
  const uint64_t budget = options_.memory_bytes;
  while (ram_bytes_ - queued_bytes_ + bytes > budget) {
    Entry* victim = nullptr;
    for (auto& [id, e] : entries_)
      if (e.ram && !e.queued && (!victim || e.last_used < victim->last_used)) victim = &e;
    if (!victim) break;
    if (options_.dir.empty()) {
      metrics_.ram.evictions++;
      erase(victim->id, false);
    } else if (!victim->file.empty()) {  // already on disk: only the RAM copy goes
      metrics_.ram.evictions++;
      drop_ram(*victim);
    } else {
      victim->queued = true;
      queued_bytes_ += entry_bytes(*victim);
      write_queue_.push_back(victim->id);
      writer_wake_.notify_one();
    }
  }
  const auto give_up = SteadyClock::now() + std::chrono::seconds(30);
  while (ram_bytes_ + bytes > budget + budget / 4 && queued_bytes_ > 0 &&
         written_.wait_until(lock, give_up) != std::cv_status::timeout) {
  }
}

void SessionStore::enforce_disk_budget() {
  while (disk_bytes_ > options_.disk_bytes) {
    Entry* victim = nullptr;
    for (auto& [id, e] : entries_)
      if (!e.file.empty() && (!victim || e.last_used < victim->last_used)) victim = &e;
    if (!victim) return;
    metrics_.disk.evictions++;
    if (victim->ram) {  // keep the RAM copy, delete the file
      ::unlink((options_.dir + "/" + victim->file).c_str());
      files_.erase(victim->file);
      disk_bytes_ -= victim->file_bytes;
      victim->file.clear();
      victim->file_bytes = 0;
    } else {
      erase(victim->id, true);
    }
  }
}

void SessionStore::writer_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    writer_wake_.wait(lock, [&] { return stopping_ || !write_queue_.empty(); });
    if (stopping_) return;
    const uint64_t id = write_queue_.front();
    write_queue_.pop_front();
    auto it = entries_.find(id);
    if (it == entries_.end() || !it->second.ram || !it->second.queued) continue;
    std::shared_ptr<uint8_t[]> blob = it->second.ram;
    std::vector<int32_t> tokens = it->second.tokens;
    auto ranges = ram_ranges(it->second, blob.get());
    const std::string name = session_file_name(options_.identity, tokens);
    ++writing_;
    lock.unlock();
    std::string error;
    try {
      write_session_file(options_.dir, name, options_.identity, tokens, ranges);
    } catch (const std::exception& ex) {
      error = ex.what();
    }
    lock.lock();
    --writing_;
    const uint64_t bytes = tokens.size() * options_.identity.bytes_per_token();
    it = entries_.find(id);
    if (it != entries_.end() && it->second.queued) {
      it->second.queued = false;
      queued_bytes_ -= bytes;
    }
    if (!error.empty()) {
      log_warn("sessions: " + error + "; the session is dropped");
      metrics_.disk.failures++;
      metrics_.ram.evictions++;
      if (it != entries_.end()) erase(id, false);
    } else if (it == entries_.end()) {
      ::unlink((options_.dir + "/" + name).c_str());  // dropped or replaced while being written
    } else {
      if (auto old = files_.find(name); old != files_.end() && old->second != id) erase(old->second, false);
      Entry& e = it->second;
      e.file = name;
      e.file_bytes = bytes;
      files_[name] = id;
      disk_bytes_ += bytes;
      metrics_.disk.bytes_out += int64_t(bytes);
      metrics_.ram.evictions++;
      drop_ram(e);
      enforce_disk_budget();
    }
    written_.notify_all();
  }
}

void SessionStore::flush(SteadyClock::time_point deadline) {
  std::unique_lock lock(mutex_);
  if (options_.dir.empty()) return;
  for (auto& [id, e] : entries_)
    if (e.ram && e.file.empty() && !e.queued) {
      e.queued = true;
      queued_bytes_ += entry_bytes(e);
      write_queue_.push_back(id);
    }
  writer_wake_.notify_one();
  written_.wait_until(lock, deadline, [&] { return write_queue_.empty() && writing_ == 0; });
}

std::vector<SessionInfo> SessionStore::list() {
  std::lock_guard lock(mutex_);
  rescan_locked();
  std::vector<SessionInfo> out;
  const auto now = SteadyClock::now();
  for (const auto& [id, e] : entries_) {
    SessionInfo info;
    info.id = hex_id(id);
    info.tier = e.ram ? SessionTier::ram : SessionTier::disk;
    info.tokens = int64_t(e.tokens.size());
    info.bytes = int64_t(entry_bytes(e));
    info.idle_seconds = e.last_used == 0 ? -1 : std::chrono::duration<double>(now - e.used_at).count();
    out.push_back(std::move(info));
  }
  return out;
}

int64_t SessionStore::drop_all() {
  std::lock_guard lock(mutex_);
  std::vector<uint64_t> ids;
  for (const auto& [id, e] : entries_) ids.push_back(id);
  for (uint64_t id : ids) erase(id, true);
  return int64_t(ids.size());
}

SessionMetrics SessionStore::metrics() {
  std::lock_guard lock(mutex_);
  SessionMetrics m = metrics_;
  m.ram.sessions = m.disk.sessions = 0;
  for (const auto& [id, e] : entries_) {
    m.ram.sessions += e.ram ? 1 : 0;
    m.disk.sessions += e.file.empty() ? 0 : 1;
  }
  m.ram.bytes = int64_t(ram_bytes_);
  m.disk.bytes = int64_t(disk_bytes_);
  return m;
}

void SessionStore::count_hot_hit(int64_t tokens, int64_t bytes, double seconds) {
  std::lock_guard lock(mutex_);
  metrics_.hot.hits++;
  metrics_.hot.tokens += tokens;
  metrics_.hot.bytes_in += bytes;
  metrics_.hot.restore_seconds += seconds;
}

}  // namespace ellm
