#include "base/threads.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>

#include "base/cpu.h"

namespace ellm {
namespace {

constexpr int kSpinIterations = 20000;
// Contention check: time every kSampleEvery-th run. Run solo, the caller would take about n times
// its own share; over kWindow samples, when that beats the team's wall time by kSoloMargin the
// cores are shared (another process on a worker's core brings the caller's share of the wall time
// to about 0.2 with two members; on a quiet VM it dips to 0.5 at worst). Then run solo for a
// while (time, not runs: one run of a long prefill can take seconds) and try the team again;
// each retry that finds the cores still shared doubles the solo time, up to kMaxSoloSeconds.
// The first switch takes two shared windows in a row: on a VM, the first runs after an idle
// spell can be slow enough to look shared.
constexpr int kSampleEvery = 8;
constexpr int kWindow = 64;
constexpr double kSoloMargin = 0.8;
constexpr double kMinSoloSeconds = 0.5;
constexpr double kMaxSoloSeconds = 4.0;

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double wall_seconds() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
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
    : n_(n_threads < 1 ? 1 : n_threads), adaptive_(adaptive), claimed_(size_t(n_)) {
  pinned_ = pin && n_ > 1 && sched_getaffinity(0, sizeof(creator_cpus_), &creator_cpus_) == 0;
  for (int member = 1; member < n_; ++member)
    threads_.emplace_back([this, member] {
      if (pinned_) pin_to_cpu(member, creator_cpus_);
      worker_loop(member);
    });
}

ThreadTeam::~ThreadTeam() {
  stop_.store(true);
  generation_.fetch_add(1, std::memory_order_release);
  futex_wake_all(generation_);
  for (auto& t : threads_) t.join();
}

void ThreadTeam::run_erased(Task task, void* ctx) {
  if (n_ == 1) {
    task(ctx, 0, 1);
    return;
  }
  if (solo_until_ > 0) {  // the machine is shared: every share here, the workers sleep
    if (wall_seconds() < solo_until_) {
      for (int member = 0; member < n_; ++member) task(ctx, member, n_);
      return;
    }
    solo_until_ = 0;
    retrying_ = true;
  }
  if (!adaptive_ || ++runs_ % kSampleEvery != 0) return run_team(task, ctx, nullptr);
  double wall = wall_seconds(), cpu = thread_cpu_seconds();
  double own_done_cpu = 0;  // the caller's CPU clock when its own (and taken) shares were done
  run_team(task, ctx, &own_done_cpu);
  note_timing(wall_seconds() - wall, own_done_cpu - cpu);
}

void ThreadTeam::note_timing(double wall, double working) {
  sampled_wall_ += wall;
  sampled_working_ += working;
  if (++samples_ < kWindow) return;
  bool shared = double(n_) * sampled_working_ < kSoloMargin * sampled_wall_;
  shared_windows_ = shared ? shared_windows_ + 1 : 0;
  if (shared && (retrying_ || shared_windows_ >= 2)) {
    shared_windows_ = 0;
    solo_seconds_ = retrying_ ? std::min(2 * solo_seconds_, kMaxSoloSeconds) : kMinSoloSeconds;
    solo_until_ = wall_seconds() + solo_seconds_;
    ++solo_switches_;
  }
  retrying_ = false;
  samples_ = 0;
  sampled_wall_ = sampled_working_ = 0;
}

void ThreadTeam::run_team(Task task, void* ctx, double* own_done_cpu) {
  task_ = task;
  ctx_ = ctx;
  pending_.store(n_ - 1, std::memory_order_relaxed);
  uint32_t generation = generation_.fetch_add(1, std::memory_order_seq_cst) + 1;
  if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(generation_);
  task(ctx, 0, n_);
  for (int member = 1; member < n_; ++member)  // shares no worker has started yet
    if (claim(member, generation)) run_share(member);
  if (own_done_cpu) *own_done_cpu = thread_cpu_seconds();
  for (int spin = 0; spin < kSpinIterations; ++spin) {
    if (pending_.load(std::memory_order_acquire) == 0) return;
    cpu_relax();
  }
  main_sleeping_.store(true, std::memory_order_seq_cst);
  for (int left; (left = pending_.load(std::memory_order_seq_cst)) != 0;)
    futex_wait(pending_, left);
  main_sleeping_.store(false, std::memory_order_relaxed);
}

void ThreadTeam::worker_loop(int member) {
  uint32_t seen = 0;  // the generation at construction: a run() may come before this thread starts
  for (;;) {
    uint32_t now = seen;
    for (int spin = 0; spin < kSpinIterations; ++spin) {
      now = generation_.load(std::memory_order_acquire);
      if (now != seen) break;
      cpu_relax();
    }
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

void ThreadTeam::run_share(int member) {
  task_(ctx_, member, n_);
  if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
      main_sleeping_.load(std::memory_order_seq_cst))
    futex_wake_all(pending_);
}

}  // namespace ellm
