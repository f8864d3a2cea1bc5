#pragma once
// A persistent team of worker threads, one pinned per core. The calling thread is member 0, so
// a team of n starts n-1 threads. run() is a fork-join: every member calls fn(member, n) and
// run() returns when all have finished. Waiting spins briefly, then sleeps on a futex, so a
// quiet machine gets microsecond hand-offs and a shared one is not burned by spinning.
#include <sched.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace ellm {

class ThreadTeam {
 public:
  explicit ThreadTeam(int n_threads, bool pin = true);
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  int size() const { return n_; }

  // fn(int member, int n_members). No allocation: fn is passed by reference.
  template <class Fn>
  void run(Fn&& fn) {
    run_erased([](void* ctx, int member, int n) { (*static_cast<Fn*>(ctx))(member, n); }, &fn);
  }

 private:
  using Task = void (*)(void*, int, int);
  void run_erased(Task task, void* ctx);
  void worker_loop(int member);

  int n_;
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
};

// Splits [0, total) into n near-equal parts; returns member's [begin, end).
inline std::pair<int64_t, int64_t> split_range(int64_t total, int member, int n) {
  int64_t base = total / n, extra = total % n;
  int64_t begin = member * base + std::min<int64_t>(member, extra);
  return {begin, begin + base + (member < extra ? 1 : 0)};
}

}  // namespace ellm
