#include "base/threads.h"

#include <gtest/gtest.h>

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "base/cpu.h"
#include "base/error.h"
#include "base/memory.h"

namespace ellm {

TEST(ThreadTeam, EveryMemberRunsOncePerCall) {
  ThreadTeam team(3, /*pin=*/false);
  std::vector<std::atomic<int>> hits(3);
  for (int round = 0; round < 1000; ++round)
    team.run([&](int member, int n) {
      ASSERT_EQ(n, 3);
      hits[member].fetch_add(1);
    });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1000);
}

// Timing: nothing counted while off; on, every run, its wall time, and each share's busy time,
// which a share that sleeps 2 ms fills: member 1 sleeps, member 0 returns at once, so about
// half of the two members' time in the runs is idle.
TEST(ThreadTeam, TimingCountsRunsAndTheMembersBusyTime) {
  ThreadTeam team(2, /*pin=*/false, /*adaptive=*/false);
  team.run([](int, int) {});
  EXPECT_EQ(team.timing().runs, 0);
  team.set_timing(true);
  for (int round = 0; round < 10; ++round)
    team.run([](int member, int) {
      if (member == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    });
  const TeamTime t = team.timing();
  EXPECT_EQ(t.runs, 10);
  EXPECT_GE(t.wall_seconds, 10 * 0.002);
  EXPECT_GE(t.busy_seconds, 10 * 0.002);
  EXPECT_LE(t.busy_seconds, 2 * t.wall_seconds);
  EXPECT_GT(2 * t.wall_seconds - t.busy_seconds, 0.4 * t.wall_seconds) << "member 0 waited";
  team.set_timing(false);
  team.run([](int, int) {});
  EXPECT_EQ(team.timing().runs, 10);
  EXPECT_EQ((team.timing() - t).wall_seconds, 0);
}

// Runs rounds until the worker (not the caller) has run member 1's share; the caller's share
// waits up to 50 ms for it to start, so a loaded machine still gives the worker its chance.
// Returns what `on_worker` recorded, or false if the worker never ran a share.
template <class Fn>
bool run_until_worker_runs(ThreadTeam& team, Fn&& on_worker) {
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> started{false}, by_worker{false};
  for (int round = 0; round < 100 && !by_worker; ++round) {
    started = false;
    team.run([&](int member, int) {
      if (member == 1) {
        started = true;
        if (std::this_thread::get_id() != caller) on_worker(), by_worker = true;
        return;
      }
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
      while (!started && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    });
  }
  return by_worker;
}

TEST(ThreadTeam, SplitRangeCoversEverythingOnce) {
  for (int64_t total : {0, 1, 7, 64, 1001})
    for (int n : {1, 2, 3, 8}) {
      int64_t expect_begin = 0;
      for (int m = 0; m < n; ++m) {
        auto [b, e] = split_range(total, m, n);
        EXPECT_EQ(b, expect_begin);
        EXPECT_GE(e, b);
        expect_begin = e;
      }
      EXPECT_EQ(expect_begin, total);
    }
}

// share_work: every item once, whatever order the members come in; a member's first piece is
// its even part of the home three quarters; the one that comes first takes every pooled chunk.
TEST(ThreadTeam, ShareWorkCoversEverythingOnceInAnyOrder) {
  for (int64_t total : {0, 1, 7, 64, 1001})
    for (int n : {1, 2, 3}) {
      std::atomic<int64_t> pool{0};
      std::vector<int> seen(size_t(total), 0);
      std::vector<std::vector<std::pair<int64_t, int64_t>>> pieces(static_cast<size_t>(n));
      for (int m = n - 1; m >= 0; --m)  // one after another, last member first
        share_work(total, m, n, &pool, [&](int64_t b, int64_t e) {
          pieces[size_t(m)].push_back({b, e});
          for (int64_t i = b; i < e; ++i) ++seen[size_t(i)];
        });
      for (int64_t i = 0; i < total; ++i) ASSERT_EQ(seen[size_t(i)], 1) << total << " " << n << " " << i;
      const int64_t home = n > 1 ? total * 3 / 4 : total;
      for (int m = 0; m < n; ++m) {
        auto [b, e] = split_range(home, m, n);
        if (b < e) ASSERT_EQ(pieces[size_t(m)].front(), std::make_pair(b, e));
        // Only the member that came first (n - 1) found chunks left in the pool.
        size_t home_pieces = b < e ? 1 : 0;
        if (m != n - 1) EXPECT_EQ(pieces[size_t(m)].size(), home_pieces) << total << " " << n << " " << m;
      }
    }
  // Without a pool: the split_range part alone.
  std::vector<std::pair<int64_t, int64_t>> got;
  share_work(100, 1, 3, nullptr, [&](int64_t b, int64_t e) { got.push_back({b, e}); });
  EXPECT_EQ(got, (std::vector<std::pair<int64_t, int64_t>>{split_range(100, 1, 3)}));
}

// Members that run together on a team, each slowed differently, still cover every item once.
TEST(ThreadTeam, ShareWorkOnATeamCoversEverythingOnce) {
  ThreadTeam team(3, /*pin=*/false);
  for (int round = 0; round < 20; ++round) {
    std::atomic<int64_t> pool{0};
    std::vector<std::atomic<int>> seen(997);
    team.run([&](int m, int n) {
      share_work(997, m, n, &pool, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) seen[size_t(i)].fetch_add(1);
        if (m == round % 3) std::this_thread::sleep_for(std::chrono::microseconds(50));
      });
    });
    for (auto& s : seen) ASSERT_EQ(s.load(), 1);
  }
}

TEST(VirtualRegion, CommitsOnlyWrittenPages) {
  size_t huge = size_t(64) << 30;  // 64 GiB of address space, far beyond this machine's RAM
  VirtualRegion region(huge);
  EXPECT_LT(region.resident_bytes(), size_t(1) << 20);
  for (size_t off = 0; off < (size_t(8) << 20); off += 4096) region.data()[off] = 1;
  size_t resident = region.resident_bytes();
  EXPECT_GE(resident, size_t(8) << 20);
  EXPECT_LT(resident, size_t(12) << 20);
  region.release(0, size_t(8) << 20);
  EXPECT_LT(region.resident_bytes(), size_t(1) << 20);
  EXPECT_EQ(region.data()[4096], 0);
}

TEST(Cpu, ActiveIsaIsSupported) {
  EXPECT_LE(int(active_isa()), int(best_isa()));
  EXPECT_EQ(supported_isas().front(), Isa::scalar);
  EXPECT_THROW(parse_isa("sse9"), Error);
}

}  // namespace ellm

namespace ellm {

// Workers are pinned one per CPU of the creator's mask and the creator keeps its whole mask, so
// a later team spreads over every CPU again (a team once pinned its creator to one CPU, and the
// next team inherited that mask and ran all its members on one core).
TEST(ThreadTeam, WorkersArePinnedAndTheCallerKeepsAllItsCpus) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "needs two CPUs";
  { ThreadTeam first(2); first.run([](int, int) {}); }
  ThreadTeam second(2);
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
  EXPECT_EQ(CPU_COUNT(&mine), CPU_COUNT(&allowed));
  // The caller may run a worker's share itself (when the worker has not started it yet), so
  // run until the worker has run one, and look at its mask from there.
  int worker_cpus = -1, worker_cpu = -1;
  ASSERT_TRUE(run_until_worker_runs(second, [&] {
    cpu_set_t set;
    sched_getaffinity(0, sizeof(set), &set);
    worker_cpus = CPU_COUNT(&set);
    worker_cpu = sched_getcpu();
  })) << "the worker never ran a share";
  EXPECT_EQ(worker_cpus, 1);
  EXPECT_TRUE(CPU_ISSET(worker_cpu, &allowed));
}

// A worker that cannot run (here: stuck in a signal handler, as if another process held its
// core) does not hold up run(): the caller runs its shares, each exactly once.
std::atomic<bool> g_release_worker{false};
void hold_worker(int) {
  while (!g_release_worker.load()) {
    timespec pause{0, 1000000};
    nanosleep(&pause, nullptr);
  }
}

TEST(ThreadTeam, CallerRunsTheSharesOfAStalledWorker) {
  ThreadTeam team(2, /*pin=*/false);
  pthread_t worker{};
  ASSERT_TRUE(run_until_worker_runs(team, [&] { worker = pthread_self(); }))
      << "the worker never ran a share";

  struct sigaction action {}, previous{};
  action.sa_handler = hold_worker;
  ASSERT_EQ(sigaction(SIGUSR1, &action, &previous), 0);
  g_release_worker = false;
  ASSERT_EQ(pthread_kill(worker, SIGUSR1), 0);
  timespec settle{0, 20000000};
  nanosleep(&settle, nullptr);  // the worker is now inside hold_worker

  std::vector<std::atomic<int>> hits(2);
  auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 200; ++round)
    team.run([&](int member, int n) {
      ASSERT_EQ(n, 2);
      hits[member].fetch_add(1);
    });
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(hits[0].load(), 200);
  EXPECT_EQ(hits[1].load(), 200);
  EXPECT_LT(seconds, 5.0);  // without stealing, the first run would wait forever

  g_release_worker = true;  // the worker comes back, finds its shares taken, and keeps working
  for (int round = 0; round < 200; ++round) team.run([&](int member, int) { hits[member].fetch_add(1); });
  EXPECT_EQ(hits[0].load(), 400);
  EXPECT_EQ(hits[1].load(), 400);
  sigaction(SIGUSR1, &previous, nullptr);
}

// Another process spinning on the worker's core makes every team run wait for the worker; the
// contention check sees it and sends the team solo (leaving that core to the other process).
// The spinner starts once the team has warmed up, so a quiet start cannot pass the test.
TEST(ThreadTeam, GoesSoloWhileAnotherProcessHoldsAWorkersCore) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "needs two CPUs";
  if (access("/proc/thread-self/schedstat", R_OK) != 0)
    GTEST_SKIP() << "no /proc/<tid>/schedstat (CONFIG_SCHED_INFO): the team cannot see contention";
  int worker_cpu = -1;  // member 1 is pinned to the second CPU of the creator's mask
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE && worker_cpu < 0; ++cpu)
    if (CPU_ISSET(cpu, &allowed) && seen++ == 1) worker_cpu = cpu;

  int start_pipe[2];
  ASSERT_EQ(pipe(start_pipe), 0);
  pid_t spinner = fork();  // before the team exists: the child never sees its threads
  ASSERT_GE(spinner, 0);
  if (spinner == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(start_pipe[1]);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(worker_cpu, &one);
    sched_setaffinity(0, sizeof(one), &one);
    char go = 0;
    if (read(start_pipe[0], &go, 1) != 1) _exit(0);
    volatile uint64_t x = 0;
    for (;;) x = x + 1;
  }
  close(start_pipe[0]);

  ThreadTeam team(2);
  std::atomic<uint64_t> sink{0};
  auto work = [&](int, int) {  // tens of microseconds per share, like a decode step's operations
    uint64_t x = 0;
    for (int i = 0; i < 20000; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
    sink.fetch_add(x, std::memory_order_relaxed);
  };
  for (int i = 0; i < 4000; ++i) team.run(work);
  int64_t quiet_switches = team.solo_switches();
  char go = 1;
  ASSERT_EQ(write(start_pipe[1], &go, 1), 1);
  auto start = std::chrono::steady_clock::now();
  while (team.solo_switches() == quiet_switches &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(10))
    team.run(work);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  kill(spinner, SIGKILL);
  waitpid(spinner, nullptr, 0);
  close(start_pipe[1]);
  EXPECT_GT(team.solo_switches(), quiet_switches) << "no switch to solo in " << seconds << " s";
}

}  // namespace ellm
