// The AMX tier's register-only peak loop, for measure_peak_flops.
#include <immintrin.h>

#include <cstdint>

#include "kernels/amx/amx_tiles.h"

namespace ellm {

// Four independent tile accumulators (tmm0-3) fed by two A and two B tiles that stay in the
// tile registers: the loop runs at the TMUL's throughput, 4 x 16x16x32 MACs per iteration.
// Returns a value so the compiler cannot drop the work.
float peak_loop_amx_bf16(int64_t iterations) {
  amx::TileConfig config;
  for (int t = 0; t < 8; ++t) config.rows[t] = 16, config.colsb[t] = 64;
  amx::load_tile_config(config);
  alignas(64) uint16_t ones[16 * 32];
  for (auto& v : ones) v = 0x3f80;  // 1.0 in BF16
  alignas(64) float out[16 * 16];
  asm volatile("" ::: "memory");
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  asm volatile("" ::: "memory");
  return out[0];
}

}  // namespace ellm
