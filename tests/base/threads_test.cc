#include "base/threads.h"

#include <gtest/gtest.h>

#include <atomic>
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

// A team pins its creator; once it is gone, the next team must still spread over every CPU
// (it once inherited the creator's single-CPU mask and ran all members on one core).
TEST(ThreadTeam, LaterTeamSpreadsOverAllCpus) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "needs two CPUs";
  { ThreadTeam first(2); first.run([](int, int) {}); }
  ThreadTeam second(2);
  std::vector<int> cpu(2, -1);
  second.run([&](int member, int) { cpu[member] = sched_getcpu(); });
  EXPECT_NE(cpu[0], cpu[1]);
}

}  // namespace ellm
