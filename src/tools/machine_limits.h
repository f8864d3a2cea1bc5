#pragma once
// The machine's own limits, measured: what `ellm bench` divides achieved figures by.
#include <cstddef>
#include <cstdint>

#include "base/memory.h"

namespace ellm {

class ThreadTeam;

// Peak BF16 multiply-accumulate rate of a register-only loop on every member of the team, in
// FLOP/s (2 per MAC): AMX BF16 tile products, AVX-512-BF16 dot products, or AVX2 FMA on FP32,
// for the active tier.
double measure_peak_flops(ThreadTeam& team, double seconds = 0.3);
// Peak FP32 FMA rate of the tier's widest vectors (AVX-512, or AVX2), in FLOP/s: the limit of
// work that stays in FP32, such as the Gated DeltaNet delta rule.
double measure_peak_flops_f32(ThreadTeam& team, double seconds = 0.3);

// A probe buffer size far beyond the last-level cache: twice its size, and at least 256 MiB
// (some Xeons report an L3 of hundreds of MiB).
size_t read_probe_bytes();

// Read bandwidth of all members streaming disjoint parts of a buffer of `bytes` (choose it far
// beyond the last-level cache), in bytes/s; best of a few passes of each read loop (below).
double measure_read_bandwidth(ThreadTeam& team, size_t bytes = read_probe_bytes(), int passes = 5);

// The same reading, taken again and again from one buffer committed once: for readings between
// the parts of a run, which must not each pay to commit a fresh buffer. `team` must outlive it.
class ReadBandwidthProbe {
 public:
  ReadBandwidthProbe(ThreadTeam& team, size_t bytes);
  // bytes/s, best of `passes` passes with each of three read loops: plain sums, the dot products
  // decode runs on each line, and sums with software prefetch 2 KiB ahead (AVX-512 tiers)
  double measure(int passes);

 private:
  enum class ReadLoop { sums, dots, prefetched };
  double pass(ReadLoop loop);

  ThreadTeam& team_;
  size_t bytes_;
  Buffer<uint8_t> buffer_;
};

}  // namespace ellm
