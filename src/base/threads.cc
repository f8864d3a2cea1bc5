#include "base/threads.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <fcntl.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <cstdlib>

#include "base/cpu.h"

namespace ellm {
namespace {

// A waiting thread spins this long before it sleeps: longer than the gaps inside a decode step
// (the members of a large GEMV finish up to a few hundred microseconds apart), so a quiet
// machine makes no system call per token; short enough that an idle team soon sleeps.
constexpr double kSpinSeconds = 2e-3;
// Contention check: every kCheckEvery-th team run reads the clock; once per kWindowSeconds it
// reads each member thread's run-queue wait from /proc (schedstat: time spent runnable but not
// running). A member that waited for its core for more than kMaxWaitShare of the window shares
// that core with another process, and every team run waits for it: run solo for a while (time,
// not runs: one run of a long prefill can take seconds), then try the team again; each retry
// that finds the cores still shared doubles the solo time, up to kMaxSoloSeconds. On a quiet
// machine the wait is near zero, and uneven shares of work do not look like contention.
constexpr int kCheckEvery = 8;
constexpr double kWindowSeconds = 0.1;
constexpr double kMaxWaitShare = 0.2;
constexpr double kMinSoloSeconds = 0.5;
constexpr double kMaxSoloSeconds = 4.0;

double wall_seconds() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// The calling thread's schedstat file, or -1.
int open_own_schedstat() { return open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC); }

// Run-queue wait in nanoseconds (the second field of schedstat), or -1.
int64_t read_runqueue_wait(int fd) {
  if (fd < 0) return -1;
  char text[128];
  ssize_t got = pread(fd, text, sizeof(text) - 1, 0);
  if (got <= 0) return -1;
  text[got] = 0;
  char* end = nullptr;
  std::strtoull(text, &end, 10);
  if (end == text) return -1;
  char* wait_end = nullptr;
  unsigned long long wait = std::strtoull(end, &wait_end, 10);
  return wait_end == end ? -1 : int64_t(wait);
}

pid_t own_tid() {
  thread_local pid_t tid = pid_t(syscall(SYS_gettid));
  return tid;
}

// Pins the calling thread to the index-th CPU of `allowed` (the creator's CPUs, read before
// anything was pinned: a worker's own mask would already be narrowed by its creator's pin).
void pin_to_cpu(int index, const cpu_set_t& allowed) {
  int count = CPU_COUNT(&allowed);
  if (count == 0) return;
  int target = index % count, seen = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (seen++ == target) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
      return;
    }
  }
}

inline void cpu_relax() { __builtin_ia32_pause(); }

// Spins until done() or kSpinSeconds have passed; returns done(). Reads the clock (a vDSO call)
// once every 64 pauses.
template <class Done>
bool spin_until(Done&& done) {
  double give_up = 0;
  for (int spin = 0;; ++spin) {
    if (done()) return true;
    if (spin % 64 == 0) {
      double now = wall_seconds();
      if (give_up == 0) give_up = now + kSpinSeconds;
      else if (now > give_up) return false;
    }
    cpu_relax();
  }
}

// Direct futex calls: libstdc++ 12's std::atomic::wait can lose wake-ups.
template <class T>
void futex_wait(std::atomic<T>& word, T expected) {
  static_assert(sizeof(T) == 4);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, uint32_t(expected),
          nullptr, nullptr, 0);
}

template <class T>
void futex_wake_all(std::atomic<T>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr,
          nullptr, 0);
}

}  // namespace

ThreadTeam::ThreadTeam(int n_threads, bool pin, bool adaptive)
    : n_(n_threads < 1 ? 1 : n_threads),
      adaptive_(adaptive),
      claimed_(size_t(n_)),
      busy_(size_t(n_)),
      schedstat_fds_(size_t(n_)),
      window_waits_(size_t(n_)) {
  for (auto& fd : schedstat_fds_) fd.store(-1);
  pinned_ = pin && n_ > 1 && sched_getaffinity(0, sizeof(creator_cpus_), &creator_cpus_) == 0;
  for (int member = 1; member < n_; ++member)
    threads_.emplace_back([this, member] {
      if (pinned_) pin_to_cpu(member, creator_cpus_);
      if (adaptive_) schedstat_fds_[member].store(open_own_schedstat(), std::memory_order_release);
      worker_loop(member);
    });
}

ThreadTeam::~ThreadTeam() {
  stop_.store(true);
  generation_.fetch_add(1, std::memory_order_release);
  futex_wake_all(generation_);
  for (auto& t : threads_) t.join();
  for (auto& fd : schedstat_fds_)
    if (fd.load() >= 0) close(fd.load());
}

void ThreadTeam::run_erased(Task task, void* ctx) {
  const double start = timing_ ? wall_seconds() : 0;
  const bool alone = n_ == 1 || solo_now();
  if (alone) {  // every share here; the workers sleep
    for (int member = 0; member < n_; ++member) task(ctx, member, n_);
  } else {
    if (adaptive_ && ++runs_ % kCheckEvery == 0) check_contention();
    run_team(task, ctx);
  }
  if (!timing_) return;
  const double seconds = wall_seconds() - start;
  time_.runs += 1;
  time_.wall_seconds += seconds;
  if (alone) busy_[0].seconds += seconds;
}

bool ThreadTeam::solo_now() {
  if (solo_until_ == 0) return false;
  if (wall_seconds() < solo_until_) return true;
  solo_until_ = 0;  // the solo period is over: the team tries again
  retrying_ = true;
  return false;
}

TeamTime ThreadTeam::timing() const {
  TeamTime t = time_;
  for (const Busy& b : busy_) t.busy_seconds += b.seconds;
  return t;
}

void ThreadTeam::check_contention() {
  double now = wall_seconds();
  if (window_start_ > 0 && now - window_start_ < kWindowSeconds) return;
  if (caller_tid_ != own_tid()) {  // member 0 is whichever thread calls run()
    caller_tid_ = own_tid();
    int old = schedstat_fds_[0].exchange(open_own_schedstat());
    if (old >= 0) close(old);
    window_start_ = 0;
  }
  double worst = 0;  // the largest share of the window a member spent waiting for its core
  for (int member = 0; member < n_; ++member) {
    int64_t wait = read_runqueue_wait(schedstat_fds_[member].load(std::memory_order_acquire));
    if (window_start_ > 0 && wait >= 0 && window_waits_[member] >= 0)
      worst = std::max(worst, 1e-9 * double(wait - window_waits_[member]) / (now - window_start_));
    window_waits_[member] = wait;
  }
  bool decided = window_start_ > 0;  // a whole window has passed (else this one opens it)
  window_start_ = now;
  if (!decided) return;
  if (worst > kMaxWaitShare) {
    solo_seconds_ = retrying_ ? std::min(2 * solo_seconds_, kMaxSoloSeconds) : kMinSoloSeconds;
    solo_until_ = now + solo_seconds_;
    window_start_ = 0;  // the retry opens a fresh window
    ++solo_switches_;
  }
  retrying_ = false;
}

void ThreadTeam::run_team(Task task, void* ctx) {
  task_ = task;
  ctx_ = ctx;
  pending_.store(n_ - 1, std::memory_order_relaxed);
  uint32_t generation = generation_.fetch_add(1, std::memory_order_seq_cst) + 1;
  if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(generation_);
  run_timed(0);
  for (int member = 1; member < n_; ++member)  // shares no worker has started yet
    if (claim(member, generation)) run_share(member);
  if (spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) return;
  main_sleeping_.store(true, std::memory_order_seq_cst);
  for (int left; (left = pending_.load(std::memory_order_seq_cst)) != 0;)
    futex_wait(pending_, left);
  main_sleeping_.store(false, std::memory_order_relaxed);
}

void ThreadTeam::worker_loop(int member) {
  uint32_t seen = 0;  // the generation at construction: a run() may come before this thread starts
  for (;;) {
    uint32_t now = seen;
    spin_until([&] { return (now = generation_.load(std::memory_order_acquire)) != seen; });
    while (now == seen) {
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      futex_wait(generation_, seen);
      sleepers_.fetch_sub(1, std::memory_order_acq_rel);
      now = generation_.load(std::memory_order_acquire);
    }
    seen = now;
    if (stop_.load()) return;
    // The share may be taken already, and `now` may be a run that has ended since: claim()
    // fails for both, and the next loop sees the newest generation.
    if (claim(member, now)) run_share(member);
  }
}

bool ThreadTeam::claim(int member, uint32_t generation) {
  uint32_t last = claimed_[member].load(std::memory_order_acquire);
  // Generations only grow (modulo 2^32): claim when the last claim is older than this run.
  while (int32_t(last - generation) < 0)
    if (claimed_[member].compare_exchange_weak(last, generation, std::memory_order_acq_rel))
      return true;
  return false;
}

void ThreadTeam::run_timed(int member) {
  if (!timing_) {
    task_(ctx_, member, n_);
    return;
  }
  const double start = wall_seconds();
  task_(ctx_, member, n_);
  busy_[member].seconds += wall_seconds() - start;
}

void ThreadTeam::run_share(int member) {
  run_timed(member);
  if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
      main_sleeping_.load(std::memory_order_seq_cst))
    futex_wake_all(pending_);
}

}  // namespace ellm
