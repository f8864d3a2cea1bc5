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

int64_t SessionStore::resumable(const Entry& e, int64_t common) const {
  if (!hybrid()) return common;
  const StateSnapshot* s = snapshot_at_or_before(e.snapshots, common);
  return s ? s->position : 0;
}

SessionStore::Entry* SessionStore::insert(std::vector<int32_t> tokens, std::vector<StateSnapshot> snapshots) {
  Entry entry;
  entry.id = next_id_++;
  entry.blocks = block_hashes(tokens);
  entry.tokens = std::move(tokens);
  entry.snapshots = std::move(snapshots);
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
  drop_ram(e);
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
  if (e.leave_ram) leaving_bytes_ -= entry_bytes(e);
  e.leave_ram = false;
  e.ram.reset();
  for (StateSnapshot& s : e.snapshots) s.state.reset();
}

void SessionStore::count_evicted(SessionTierMetrics& tier, const Entry& e) {
  tier.evictions++;
  tier.snapshots_evicted += int64_t(e.snapshots.size());
  tier.snapshot_bytes_evicted += int64_t(snapshot_bytes(e));
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
    std::vector<StateSnapshot> snapshots;
    for (int64_t position : info->snapshots) snapshots.push_back({position, nullptr, false});
    Entry* e = insert(std::move(info->tokens), std::move(snapshots));
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
    if (!e.ram) {
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
  // The sessions holding each block of the prompt, while any does.
  std::vector<const std::vector<uint64_t>*> holders;
  uint64_t h = options_.identity.fingerprint;
  for (size_t begin = 0; begin + kBlock <= prompt.size(); begin += kBlock) {
    h = hash_bytes(prompt.data() + begin, kBlock * sizeof(int32_t), h);
    auto it = index_.find(h);
    if (it == index_.end()) break;
    holders.push_back(&it->second);
  }
  // Deepest first. A session that is not among the holders of block d + 1 shares fewer than
  // (d + 2) blocks with the prompt; a hybrid's furthest snapshot may lie far before that, so
  // shallower holders are looked at until none can do better.
  StoredMatch best;
  uint64_t best_used = 0;
  int64_t longest = 0;
  std::vector<uint64_t> seen;
  for (size_t d = holders.size(); d-- > 0;) {
    if (best.tokens >= int64_t(d + 2) * kBlock - 1) break;
    for (uint64_t id : *holders[d]) {
      if (std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
      seen.push_back(id);
      const Entry& e = entries_.at(id);
      const int64_t common = std::min(int64_t(common_prefix(e.tokens, prompt)), max_tokens);
      const int64_t n = resumable(e, common);
      longest = std::max(longest, common);
      const SessionTier tier = e.ram ? SessionTier::ram : SessionTier::disk;
      const bool better = n > best.tokens ||
                          (n == best.tokens && (tier < best.tier || (tier == best.tier && e.last_used > best_used)));
      if (better && n > 0) {
        best = {id, n, common, tier, common == int64_t(e.tokens.size())};
        best_used = e.last_used;
      }
    }
  }
  best.common = longest;
  return best;
}

RestorePlan SessionStore::plan_restore(const StoredMatch& match, int64_t capacity) {
  std::lock_guard lock(mutex_);
  RestorePlan plan;
  auto it = entries_.find(match.id);
  if (it == entries_.end() || match.tokens <= 0) return plan;
  Entry& e = it->second;
  const int64_t n = int64_t(e.tokens.size());
  int64_t tokens = std::min(match.tokens, n);
  if (hybrid()) {
    const StateSnapshot* at = snapshot_at_or_before(e.snapshots, tokens);
    if (!at || at->position != tokens) return plan;
    plan.snapshots.push_back(*at);
    if (match.whole)
      for (const StateSnapshot& s : e.snapshots)
        if (s.position != tokens) plan.snapshots.push_back(s);
  }
  if (e.ram) {
    plan.ram = e.ram;
    plan.ram_tokens = n;
    plan.end = tokens;
  } else if (!e.file.empty()) {
    // A disk restore reads whole chunks: up to the chunk holding the last position, or the end.
    int64_t end = std::min(n, (tokens + kChunkPositions - 1) / kChunkPositions * kChunkPositions);
    if (end > capacity) {
      end = capacity / kChunkPositions * kChunkPositions;
      if (hybrid() && end < tokens) return plan;  // no snapshot below: nothing to resume
      tokens = std::min(tokens, end);
      if (tokens <= 0) return plan;
    }
    plan.path = options_.dir + "/" + e.file;
    plan.end = end;
  } else {
    return plan;
  }
  e.last_used = ++clock_;
  e.used_at = SteadyClock::now();
  plan.match = match;
  plan.match.tokens = tokens;
  return plan;
}

namespace {

bool by_position(const StateSnapshot& a, const StateSnapshot& b) { return a.position < b.position; }

void copy_into(std::span<const std::span<uint8_t>> ranges, const uint8_t* from) {
  for (std::span<uint8_t> range : ranges) {
    std::memcpy(range.data(), from, range.size());
    from += range.size();
  }
}

}  // namespace

int64_t SessionStore::restore(const RestorePlan& plan, std::span<const std::span<uint8_t>> kv,
                              std::span<const std::span<uint8_t>> state, std::vector<StateSnapshot>& inherited) {
  inherited.clear();
  if (plan.end <= 0) return 0;
  const auto start = SteadyClock::now();
  const int64_t tokens = plan.match.tokens;
  const uint64_t row = options_.identity.row_bytes, state_bytes = options_.identity.state_bytes;
  std::string why;
  bool ok = true;
  if (plan.ram) {
    for (size_t r = 0; r < kv.size(); ++r)
      std::memcpy(kv[r].data(), plan.ram.get() + r * plan.ram_tokens * row, size_t(tokens) * row);
    if (hybrid()) copy_into(state, plan.snapshots[0].state.get());
    if (plan.match.whole) inherited = plan.snapshots;
    std::sort(inherited.begin(), inherited.end(), by_position);
  } else {
    ok = read_session_kv(plan.path, options_.identity, plan.end, kv, why);
    // The snapshot resumed from, and when the prompt extends the whole session, the others.
    for (size_t i = 0; ok && i < plan.snapshots.size(); ++i) {
      StateSnapshot s = plan.snapshots[i];
      s.state = new_state_buffer(state_bytes);
      ok = read_session_state(plan.path, options_.identity, s.position, s.state.get(), why);
      if (ok && i == 0) copy_into(state, s.state.get());
      inherited.push_back(std::move(s));
    }
    if (!plan.match.whole) inherited.clear();
    std::sort(inherited.begin(), inherited.end(), by_position);
  }
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  std::lock_guard lock(mutex_);
  if (!ok) {
    inherited.clear();
    fail_restore(plan.match.id, plan.path, why);
    return 0;
  }
  SessionTierMetrics& tier = plan.ram ? metrics_.ram : metrics_.disk;
  const int64_t snapshots = plan.ram ? (hybrid() ? 1 : 0) : int64_t(plan.snapshots.size());
  tier.hits++;
  tier.tokens += tokens;
  tier.bytes_in += (plan.ram ? tokens : plan.end) * int64_t(options_.identity.bytes_per_token()) +
                   snapshots * int64_t(state_bytes);
  tier.restore_seconds += seconds;
  tier.snapshots_restored += snapshots;
  tier.snapshot_bytes_restored += snapshots * int64_t(state_bytes);
  return tokens;
}

// A file that failed its checks while restoring: dropped, unless another server replaced it.
void SessionStore::fail_restore(uint64_t id, const std::string& path, const std::string& why) {
  const std::string name = std::filesystem::path(path).filename().string();
  auto entry = files_.find(name);
  if (entry != files_.end()) erase(entry->second, false);
  if (::access(path.c_str(), F_OK) != 0) return;  // replaced or dropped by another server
  log_warn("sessions: cannot restore " + path + ": " + why + "; computing the prompt instead");
  metrics_.disk.failures++;
  bad_files_[name] = true;
  (void)id;
}

void SessionStore::put(std::span<const int32_t> tokens, std::span<const std::span<const uint8_t>> ranges,
                       std::vector<StateSnapshot> snapshots) {
  const int64_t n = int64_t(tokens.size());
  if (n < kBlock || ranges.size() != options_.identity.n_ranges) return;
  if (hybrid() && snapshots.empty()) return;  // it could resume nowhere
  if (!hybrid()) snapshots.clear();
  std::unique_lock lock(mutex_);
  // Already held (the same tokens or an extension of them): only touch it, and give it the
  // snapshots it lacks.
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
    if (!starts_with(e.tokens, tokens)) continue;
    e.last_used = ++clock_;
    e.used_at = SteadyClock::now();
    if (e.ram && e.file.empty() && !e.queued) {  // a file holds the snapshots it was written with
      const uint64_t before = entry_bytes(e);
      const size_t held = e.snapshots.size();
      for (StateSnapshot& s : snapshots) add_snapshot(e.snapshots, std::move(s));
      ram_bytes_ += entry_bytes(e) - before;
      metrics_.ram.snapshots_taken += int64_t(e.snapshots.size() - held);
      metrics_.ram.snapshot_bytes_taken += int64_t(entry_bytes(e) - before);
    }
    return;
  }
  // Sessions this one extends are dropped: it serves every prompt they could, and takes over
  // the snapshots they hold in RAM.
  for (uint64_t id : related) {
    Entry& e = entries_.at(id);
    if (!starts_with(tokens, e.tokens)) continue;
    if (e.ram)
      for (const StateSnapshot& s : e.snapshots) add_snapshot(snapshots, s);
    erase(id, true);
  }
  thin_snapshots(snapshots, options_.snapshot_interval);
  const uint64_t state_bytes = snapshots.size() * options_.identity.state_bytes;
  const uint64_t bytes = uint64_t(n) * options_.identity.bytes_per_token() + state_bytes;
  if (bytes > options_.memory_bytes) {
    // Larger than the RAM tier: straight to disk from the slot, or not kept.
    if (options_.dir.empty()) {
      metrics_.ram.evictions++;
      return;
    }
    const std::string name = session_file_name(options_.identity, tokens, snapshots);
    std::vector<int32_t> copy(tokens.begin(), tokens.end());
    ++writing_;
    lock.unlock();
    bool ok = true;
    try {
      write_session_file(options_.dir, name, options_.identity, copy, ranges, snapshots);
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
    for (StateSnapshot& s : snapshots) s.state.reset();
    Entry* e = insert(std::move(copy), std::move(snapshots));
    e->file = name;
    e->file_bytes = bytes;  // close enough for the budget: the header is a few KiB
    files_[name] = e->id;
    disk_bytes_ += e->file_bytes;
    metrics_.disk.bytes_out += int64_t(bytes);
    metrics_.disk.snapshots_taken += int64_t(e->snapshots.size());
    metrics_.disk.snapshot_bytes_taken += int64_t(state_bytes);
    enforce_disk_budget();
    return;
  }

  make_ram_room(bytes, lock);
  std::shared_ptr<uint8_t[]> blob(new uint8_t[uint64_t(n) * options_.identity.bytes_per_token()]);
  const size_t range_bytes = size_t(n) * options_.identity.row_bytes;
  for (size_t r = 0; r < ranges.size(); ++r) std::memcpy(blob.get() + r * range_bytes, ranges[r].data(), range_bytes);
  Entry* e = insert(std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(snapshots));
  e->ram = std::move(blob);
  ram_bytes_ += bytes;
  metrics_.ram.bytes_out += int64_t(bytes);
  metrics_.ram.snapshots_taken += int64_t(e->snapshots.size());
  metrics_.ram.snapshot_bytes_taken += int64_t(state_bytes);
  // Written through to disk in the background: a crash loses only the last few seconds.
  if (!options_.dir.empty()) queue_write(*e);
}

void SessionStore::queue_write(Entry& e) {
  if (e.queued) return;
  e.queued = true;
  write_queue_.push_back(e.id);
  writer_wake_.notify_one();
}

// Frees RAM for `bytes` more: least recently used sessions leave RAM once they are on disk (the
// writer writes them first) or, without a directory, are dropped. Sessions still waiting for the
// writer hold their RAM; past a quarter over budget this waits for the writer, so RAM stays
// bounded.
void SessionStore::make_ram_room(uint64_t bytes, std::unique_lock<std::mutex>& lock) {
  const uint64_t budget = options_.memory_bytes;
  while (ram_bytes_ - leaving_bytes_ + bytes > budget) {
    Entry* victim = nullptr;
    for (auto& [id, e] : entries_)
      if (e.ram && !e.leave_ram && (!victim || e.last_used < victim->last_used)) victim = &e;
    if (!victim) break;
    if (options_.dir.empty()) {
      count_evicted(metrics_.ram, *victim);
      erase(victim->id, false);
    } else if (!victim->file.empty()) {  // already on disk: only the RAM copy goes
      count_evicted(metrics_.ram, *victim);
      drop_ram(*victim);
    } else {
      victim->leave_ram = true;
      leaving_bytes_ += entry_bytes(*victim);
      queue_write(*victim);
    }
  }
  const auto give_up = SteadyClock::now() + std::chrono::seconds(30);
  while (ram_bytes_ + bytes > budget + budget / 4 && leaving_bytes_ > 0 &&
         written_.wait_until(lock, give_up) != std::cv_status::timeout) {
  }
}

void SessionStore::enforce_disk_budget() {
  while (disk_bytes_ > options_.disk_bytes) {
    Entry* victim = nullptr;
    for (auto& [id, e] : entries_)
      if (!e.file.empty() && (!victim || e.last_used < victim->last_used)) victim = &e;
    if (!victim) return;
    count_evicted(metrics_.disk, *victim);
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
    if (it == entries_.end() || !it->second.queued) continue;
    if (!it->second.ram || !it->second.file.empty()) {
      it->second.queued = false;
      continue;
    }
    std::shared_ptr<uint8_t[]> blob = it->second.ram;
    std::vector<int32_t> tokens = it->second.tokens;
    std::vector<StateSnapshot> snapshots = it->second.snapshots;
    auto ranges = ram_ranges(it->second, blob.get());
    const std::string name = session_file_name(options_.identity, tokens, snapshots);
    ++writing_;
    lock.unlock();
    std::string error;
    try {
      write_session_file(options_.dir, name, options_.identity, tokens, ranges, snapshots);
    } catch (const std::exception& ex) {
      error = ex.what();
    }
    lock.lock();
    --writing_;
    const uint64_t state_bytes = snapshots.size() * options_.identity.state_bytes;
    const uint64_t bytes = tokens.size() * options_.identity.bytes_per_token() + state_bytes;
    it = entries_.find(id);
    if (it != entries_.end()) it->second.queued = false;
    if (!error.empty()) {
      log_warn("sessions: " + error + "; the session is not on disk");
      metrics_.disk.failures++;
      // One that had to leave RAM is dropped; one written through stays in RAM.
      if (it != entries_.end() && it->second.leave_ram) {
        count_evicted(metrics_.ram, it->second);
        erase(id, false);
      }
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
      metrics_.disk.snapshots_taken += int64_t(snapshots.size());
      metrics_.disk.snapshot_bytes_taken += int64_t(state_bytes);
      if (e.leave_ram) {
        count_evicted(metrics_.ram, e);
        drop_ram(e);
      }
      enforce_disk_budget();
    }
    written_.notify_all();
  }
}

void SessionStore::flush(SteadyClock::time_point deadline) {
  std::unique_lock lock(mutex_);
  if (options_.dir.empty()) return;
  for (auto& [id, e] : entries_)
    if (e.ram && e.file.empty()) queue_write(e);
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
    info.snapshots = int64_t(e.snapshots.size());
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
  m.ram.sessions = m.disk.sessions = m.ram.snapshots = m.disk.snapshots = 0;
  for (const auto& [id, e] : entries_) {
    const int64_t snapshots = int64_t(e.snapshots.size());
    if (e.ram) m.ram.sessions++, m.ram.snapshots += snapshots;
    if (!e.file.empty()) m.disk.sessions++, m.disk.snapshots += snapshots;
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

void SessionStore::count_hot_snapshots(int64_t taken, int64_t restored, int64_t evicted) {
  std::lock_guard lock(mutex_);
  const int64_t bytes = int64_t(options_.identity.state_bytes);
  SessionTierMetrics& hot = metrics_.hot;
  hot.snapshots_taken += taken;
  hot.snapshot_bytes_taken += taken * bytes;
  hot.snapshots_restored += restored;
  hot.snapshot_bytes_restored += restored * bytes;
  hot.snapshots_evicted += evicted;
  hot.snapshot_bytes_evicted += evicted * bytes;
}

}  // namespace ellm
