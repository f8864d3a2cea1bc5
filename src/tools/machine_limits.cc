#include "tools/machine_limits.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include <unistd.h>

#include "base/clock.h"
#include "base/cpu.h"
#include "base/memory.h"
#include "base/threads.h"

namespace ellm {

float peak_loop_avx512_bf16(int64_t iterations);
float peak_loop_amx_bf16(int64_t iterations);
float peak_loop_avx2_fma(int64_t iterations);
float peak_loop_avx512_fma(int64_t iterations);
uint64_t read_stream_avx512(const uint8_t* data, size_t bytes, bool prefetch);
uint64_t read_stream_avx2(const uint8_t* data, size_t bytes);
float read_stream_dot_avx512_bf16(const uint8_t* data, size_t bytes);
float read_stream_fma_avx2(const uint8_t* data, size_t bytes);

namespace {

uint64_t read_stream_scalar(const uint8_t* data, size_t bytes) {
  uint64_t sum = 0;
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    uint64_t v;
    std::memcpy(&v, data + i, 8);
    sum += v;
  }
  return sum;
}

}  // namespace

namespace {

// Each member times its own `loop`, so a member that waited for its core (a neighbour, the
// team running solo) does not count the wait. The rate is the sum over members of each one's
// best rate over several rounds of about `seconds` / 4 each: one round's reading swings by
// tens of percent in a VM with neighbours.
template <class Loop>
double measure_loop_rate(ThreadTeam& team, double seconds, double flop_per_iteration, Loop loop) {
  std::vector<double> best_rate(size_t(team.size()), 0.0);
  std::atomic<float> sink{0};
  auto round = [&](int64_t iterations) {
    team.run([&](int member, int) {
      double start = now_seconds();
      sink.store(loop(iterations), std::memory_order_relaxed);
      double rate = flop_per_iteration * double(iterations) / (now_seconds() - start);
      best_rate[size_t(member)] = std::max(best_rate[size_t(member)], rate);
    });
  };
  int64_t iterations = 1 << 12;
  for (;;) {
    double start = now_seconds();
    round(iterations);
    if (now_seconds() - start >= seconds / 4) break;
    iterations *= 2;
  }
  for (int i = 0; i < 6; ++i) round(iterations);
  double total = 0;
  for (double rate : best_rate) total += rate;
  return total;
}

}  // namespace

double measure_peak_flops(ThreadTeam& team, double seconds) {
  Isa isa = active_isa();
  if (isa == Isa::scalar) return 0;
  // FLOP per loop iteration: 4 tiles x 16 x 16 x 32 BF16 MACs x 2 (AMX); 12 accumulators x 16
  // lanes x 2 BF16 pairs x 2 (AVX-512); 12 x 8 x 2 (AVX2 FP32 FMA).
  double flop_per_iteration = isa == Isa::amx      ? 4.0 * 16 * 16 * 32 * 2
                              : isa == Isa::avx512 ? 12 * 16 * 2 * 2
                                                   : 12 * 8 * 2;
  return measure_loop_rate(team, seconds, flop_per_iteration, [isa](int64_t iterations) {
    switch (isa) {
      case Isa::amx: return peak_loop_amx_bf16(iterations);
      case Isa::avx512: return peak_loop_avx512_bf16(iterations);
      default: return peak_loop_avx2_fma(iterations);
    }
  });
}

double measure_peak_flops_f32(ThreadTeam& team, double seconds) {
  Isa isa = active_isa();
  if (isa == Isa::scalar) return 0;
  // 12 accumulators x 16 lanes x 2 (AVX-512, also on AMX machines) or x 8 lanes x 2 (AVX2).
  const bool wide = isa >= Isa::avx512;
  return measure_loop_rate(team, seconds, wide ? 12 * 16 * 2 : 12 * 8 * 2, [wide](int64_t iterations) {
    return wide ? peak_loop_avx512_fma(iterations) : peak_loop_avx2_fma(iterations);
  });
}

ReadBandwidthProbe::ReadBandwidthProbe(ThreadTeam& team, size_t bytes)
    : team_(team), bytes_(bytes / (4096 * size_t(team.size())) * 4096 * size_t(team.size())),
      buffer_(make_buffer<uint8_t>(bytes_)) {
  // Touch every page from its reading thread first, so the pages are committed (and, on NUMA
  // machines, local to that thread). Bytes of 0x3f read as normal numbers (0.75 in BF16 and
  // FP32), so the dot-product loop never meets a subnormal, which some cores handle slowly.
  team_.run([&](int member, int n) {
    auto [begin, end] = split_range(int64_t(bytes_ / 4096), member, n);
    std::memset(buffer_.get() + begin * 4096, 0x3f, size_t(end - begin) * 4096);
  });
}

// One pass of every member over its part with one of the read loops; seconds.
double ReadBandwidthProbe::pass(ReadLoop loop) {
  Isa isa = active_isa();
  std::atomic<uint64_t> sink{0};
  double start = now_seconds();
  team_.run([&](int member, int n) {
    auto [begin, end] = split_range(int64_t(bytes_ / 4096), member, n);
    const uint8_t* part = buffer_.get() + begin * 4096;
    size_t part_bytes = size_t(end - begin) * 4096;
    uint64_t v = 0;
    if (isa >= Isa::avx512)
      v = loop == ReadLoop::dots         ? uint64_t(read_stream_dot_avx512_bf16(part, part_bytes))
                                         : read_stream_avx512(part, part_bytes,
                                                              loop == ReadLoop::prefetched);
    else if (isa == Isa::avx2)
      v = loop == ReadLoop::dots ? uint64_t(read_stream_fma_avx2(part, part_bytes))
                                 : read_stream_avx2(part, part_bytes);
    else
      v = read_stream_scalar(part, part_bytes);
    sink.fetch_add(v, std::memory_order_relaxed);
  });
  return now_seconds() - start;
}

double ReadBandwidthProbe::measure(int passes) {
  // Which loop streams faster depends on the machine; the limit is the faster one.
  double best = 1e30;
  for (int i = 0; i < passes; ++i)
    for (ReadLoop loop : {ReadLoop::sums, ReadLoop::dots, ReadLoop::prefetched})
      if (loop != ReadLoop::prefetched || active_isa() >= Isa::avx512)  // AVX-512 tiers only
        best = std::min(best, pass(loop));
  return double(bytes_) / best;
}

size_t read_probe_bytes() {
  long last_level = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (last_level <= 0) last_level = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return std::max(size_t(256) << 20, 2 * size_t(std::max(last_level, 0L)));
}

double measure_read_bandwidth(ThreadTeam& team, size_t bytes, int passes) {
  return ReadBandwidthProbe(team, bytes).measure(passes);
}

}  // namespace ellm
