#pragma once
// A persistent team of worker threads, one pinned per core. The calling thread is member 0, so
// a team of n starts n-1 threads. run() is a fork-join: fn(member, n) runs once for every member
// share and run() returns when all shares have finished. Waiting spins briefly, then sleeps on a
// futex, so a quiet machine gets microsecond hand-offs and a shared one is not burned by spinning.
//
// A share belongs to whichever thread claims it first: after its own share the caller runs every
// share whose worker has not started yet. So a worker that another process has pushed off its
// core costs the run its share's time, not the rest of a scheduler time slice (milliseconds).
// fn must therefore depend on the member index, never on which thread runs it.
//
// When the machine is shared anyway (another process wants one of our cores), a team of n
// threads fights it for the cores and every run waits for whichever member is off its core.
// The team notices this from a member's thread waiting for its core (its run-queue wait, read
// from /proc every 0.1 s): it then runs solo for a while (the caller runs every share, the
// workers sleep), which leaves a core to the other process and keeps one fully ours; then it
// tries the team again, and stays solo longer each time the cores are still shared. Workers are
// pinned one per core; the caller is not, so the OS can move it to the free core.
#include <sched.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace ellm {

// Where a team's time went, for benchmarks (ThreadTeam::set_timing): its runs (fork-joins), the
// wall time inside them, and the members' time in their shares, summed (busy). members x wall -
// busy is the members' idle time inside runs: waking, or waiting for the last share to finish.
struct TeamTime {
  int64_t runs = 0;
  double wall_seconds = 0, busy_seconds = 0;
  TeamTime operator-(const TeamTime& o) const {
    return {runs - o.runs, wall_seconds - o.wall_seconds, busy_seconds - o.busy_seconds};
  }
};

class ThreadTeam {
 public:
  // adaptive = false keeps the whole team on every run (kernel benchmarks measure the kernels).
  explicit ThreadTeam(int n_threads, bool pin = true, bool adaptive = true);
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  int size() const { return n_; }
  // How many times the contention check has sent the team solo.
  int64_t solo_switches() const { return solo_switches_.load(std::memory_order_relaxed); }
  // Off by default; on, every share and run reads the clock twice. Caller's thread only, between
  // runs; timing() counts what ran while it was on.
  void set_timing(bool on) { timing_ = on; }
  TeamTime timing() const;

  // fn(int member, int n_members). No allocation: fn is passed by reference.
  template <class Fn>
  void run(Fn&& fn) {
    using Callable = std::remove_reference_t<Fn>;
    run_erased([](void* ctx, int member, int n) { (*static_cast<Callable*>(ctx))(member, n); },
               const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using Task = void (*)(void*, int, int);
  void run_erased(Task task, void* ctx);
  void worker_loop(int member);
  bool claim(int member, uint32_t generation);  // true for the first claim of a run's share
  void run_share(int member);                   // runs a claimed share and reports it done
  void run_timed(int member);                   // runs a share, timing it when timing_
  void run_team(Task task, void* ctx);
  void check_contention();                      // may send the team solo for a while
  bool solo_now();                              // within a solo period (ends one that is over)

  int n_;
  bool adaptive_ = true;
  bool pinned_ = false;
  cpu_set_t creator_cpus_{};
  std::vector<std::thread> threads_;
  Task task_ = nullptr;
  void* ctx_ = nullptr;
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> main_sleeping_{false};
  std::atomic<bool> stop_{false};
  std::vector<std::atomic<uint32_t>> claimed_;  // per member: the last generation claimed
  // Contention check, touched by the caller only, except that each worker opens its own file.
  std::vector<std::atomic<int>> schedstat_fds_;  // per member: its thread's schedstat, or -1
  pid_t caller_tid_ = 0;                         // the thread member 0's file belongs to
  uint64_t runs_ = 0;
  double window_start_ = 0;                      // 0: no window open
  std::vector<int64_t> window_waits_;            // per member: run-queue wait (ns) at its start
  double solo_until_ = 0;  // wall clock (CLOCK_MONOTONIC seconds) until which runs are solo
  double solo_seconds_ = 0;  // the last solo period's length
  bool retrying_ = false;    // the team is back after a solo period; this window decides
  std::atomic<int64_t> solo_switches_{0};
  // Timing (set_timing): the runs and their wall time, and each member's busy time, written by
  // whichever thread runs its share and read by the caller once the run has ended.
  struct alignas(64) Busy {
    double seconds = 0;
  };
  bool timing_ = false;
  TeamTime time_;
  std::vector<Busy> busy_;
};

// Splits [0, total) into n near-equal parts; returns member's [begin, end).
inline std::pair<int64_t, int64_t> split_range(int64_t total, int member, int n) {
  int64_t base = total / n, extra = total % n;
  int64_t begin = member * base + std::min<int64_t>(member, extra);
  return {begin, begin + base + (member < extra ? 1 : 0)};
}

// fn(begin, end) on the member's pieces of items [0, total) when members take work as they go:
// first its split_range part of the first three quarters (one contiguous range to stream), then
// chunks of the last quarter taken from `pool` (zeroed before the members start) until none is
// left. A member slowed by a shared core or a late wake-up takes fewer chunks, so the members
// finish together instead of one waiting for the other. No pool: the split_range part alone.
template <class Fn>
void share_work(int64_t total, int member, int n_members, std::atomic<int64_t>* pool, Fn&& fn) {
  const int64_t home = pool && n_members > 1 ? total * 3 / 4 : total;
  auto [begin, end] = split_range(home, member, n_members);
  if (begin < end) fn(begin, end);
  if (home == total) return;
  const int64_t chunk = std::max<int64_t>(1, (total - home) / (8 * n_members));
  for (;;) {
    int64_t first = home + pool->fetch_add(chunk, std::memory_order_relaxed);
    if (first >= total) return;
    fn(first, std::min(total, first + chunk));
  }
}

}  // namespace ellm
