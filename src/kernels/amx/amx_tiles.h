#pragma once
// AMX tile configuration, shared by the AMX files (kernels/amx, and the AMX peak probe in
// tools/amx); only files compiled with the AMX flags may include it.
#include <immintrin.h>

#include <cstdint>

namespace ellm::amx {

// The 64-byte operand of ldtilecfg (palette 1): per tile, its rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Not _tile_loadconfig: GCC 12's declares an 8-byte memory operand, so the compiler drops the
// stores of rows and colsb as dead. This operand is the whole 64 bytes.
inline void load_tile_config(const TileConfig& c) { asm volatile("ldtilecfg %0" ::"m"(c)); }

}  // namespace ellm::amx
