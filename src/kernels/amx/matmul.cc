// AMX BF16 matrix product (tdpbf16ps) on the AVX-512 packed layout (see avx512/matmul.cc).
//
// That layout already is AMX's B operand, read with a stride: in a block of 32 columns, the 16
// k pairs of one k step (32 k) are 16 rows of 128 bytes, whose left 64 bytes hold columns 0-15
// in VNNI order and whose right 64 bytes hold columns 16-31. So one tileloadd with a stride of
// 128 bytes reads B for each half of the block, and the weights need no second packing.
//
// Tiles: C in tmm0-3 (rows 0-15 | 16-31 x columns 0-15 | 16-31), A (x rows) in tmm4-5, B in
// tmm6-7. A micro-tile is up to 32 rows x 32 columns; each k step is 4 tdpbf16ps of 16x16x32.
// Decode (m <= 16): one pass per block over all of k, blocks shared out as on AVX-512, with
// software prefetch of the next k step's 2 KiB of weights: the tile loads alone leave the
// memory system idle between steps, and the Xeon hardware prefetchers do not fill that gap
// (further ahead gained nothing more).
// Prefill: k in chunks of kChunkPairs and rows in groups of kGroupRows, as on AVX-512, so a
// group's x chunk stays in L2 while every block's weight panel passes by. The chunk is long
// (all of k up to 4096): each chunk loads and stores the C tiles once more, and with short
// chunks that traffic, not the tile products, bounded Qwen3-0.6B's prefill products.
// Shapes with k or n not a multiple of 32 go to the AVX-512 kernel (Qwen3's never do).
#include <immintrin.h>

#include <algorithm>

#include "base/threads.h"
#include "kernels/amx/amx.h"
#include "kernels/amx/amx_tiles.h"

namespace ellm::amx {
namespace {

constexpr int kCols = 32;
constexpr int kStepPairs = 16;
constexpr int kTileRows = 32;
constexpr int64_t kChunkPairs = 2048;
constexpr int64_t kGroupRows = 6 * kTileRows;

// Tiles for a micro-tile of `top` (1-16) rows and `bottom` (0-16) more.
void configure(int top, int bottom) {
  TileConfig c;
  auto set = [&](int tile, int rows) {
    c.rows[tile] = uint8_t(rows);
    c.colsb[tile] = rows ? 64 : 0;
  };
  set(0, top), set(1, top), set(4, top);
  set(2, bottom), set(3, bottom), set(5, bottom);
  set(6, kStepPairs), set(7, kStepPairs);
  load_tile_config(c);
}

// y[rows][32] (=|+=) x[rows][32 * steps] . W-block, rows as configured (bottom rows when `two`);
// w is the block at the first step's pair, x at the matching k. With prefetch_bytes, each step
// prefetches the 2 KiB that far ahead. (A run-time distance: the same loop with a compile-time
// one streamed slower, for reasons of code generation not understood.)
template <bool kTwo>
void tile(const bf16* x, int64_t ldx, const bf16* w, int64_t steps, float* y, int64_t ldy,
          bool load_y, int64_t prefetch_bytes) {
  const int64_t x_stride = ldx * int64_t(sizeof(bf16)), y_stride = ldy * int64_t(sizeof(float));
  if (load_y) {
    _tile_loadd(0, y, y_stride);
    _tile_loadd(1, y + 16, y_stride);
    if (kTwo) {
      _tile_loadd(2, y + 16 * ldy, y_stride);
      _tile_loadd(3, y + 16 * ldy + 16, y_stride);
    }
  } else {
    _tile_zero(0);
    _tile_zero(1);
    if (kTwo) {
      _tile_zero(2);
      _tile_zero(3);
    }
  }
  for (int64_t s = 0; s < steps; ++s) {
    const bf16* ws = w + s * kStepPairs * 64;
    if (prefetch_bytes)
      for (int line = 0; line < kStepPairs * 128; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(ws) + prefetch_bytes + line, _MM_HINT_T1);
    _tile_loadd(6, ws, 128);
    _tile_loadd(7, ws + 32, 128);
    _tile_loadd(4, x + s * 2 * kStepPairs, x_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (kTwo) {
      _tile_loadd(5, x + 16 * ldx + s * 2 * kStepPairs, x_stride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, y, y_stride);
  _tile_stored(1, y + 16, y_stride);
  if (kTwo) {
    _tile_stored(2, y + 16 * ldy, y_stride);
    _tile_stored(3, y + 16 * ldy + 16, y_stride);
  }
}

// Rows [r0, r1) (at most kTileRows of them, when rows < kTileRows) of y against blocks
// [b0, b1), in k chunks; the tiles must be configured for r1 - r0 rows.
void rows_by_blocks(const bf16* x, int64_t ldx, const bf16* data, int64_t pairs, int64_t r0,
                    int64_t r1, int64_t b0, int64_t b1, float* y, int64_t ldy, bool accumulate) {
  for (int64_t c0 = 0; c0 < pairs; c0 += kChunkPairs) {
    const int64_t steps = std::min(kChunkPairs, pairs - c0) / kStepPairs;
    const bool load_y = accumulate || c0 > 0;
    for (int64_t g0 = r0; g0 < r1; g0 += kGroupRows) {
      const int64_t g1 = std::min(r1, g0 + kGroupRows);
      for (int64_t b = b0; b < b1; ++b) {
        const bf16* panel = data + (b * pairs + c0) * 64;
        for (int64_t t = g0; t < g1; t += kTileRows) {
          const bf16* xt = x + t * ldx + 2 * c0;
          float* yt = y + t * ldy + b * kCols;
          if (g1 - t > 16)
            tile<true>(xt, ldx, panel, steps, yt, ldy, load_y, 0);
          else
            tile<false>(xt, ldx, panel, steps, yt, ldy, load_y, 0);
        }
      }
    }
  }
}

}  // namespace

void matmul(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y, int64_t ldy,
            bool accumulate, int member, int n_members, std::atomic<int64_t>* pool) {
  if (w.k % (2 * kStepPairs) != 0 || w.n % kCols != 0)
    return avx512_kernels.matmul(x, m, ldx, w, y, ldy, accumulate, member, n_members, pool);
  const int64_t blocks = w.n / kCols, pairs = w.k / 2;
  const bf16* data = w.data.get();
  // GCC's tile load and store intrinsics declare no memory operands; keep x and y in memory
  // order around them.
  asm volatile("" ::: "memory");

  if (m <= 16) {
    configure(int(m), 0);
    share_work(blocks, member, n_members, pool, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b)
        tile<false>(x, ldx, data + b * pairs * 64, pairs / kStepPairs, y + b * kCols, ldy,
                    accumulate, kStepPairs * 128);
    });
    _tile_release();
    asm volatile("" ::: "memory");
    return;
  }
  auto [b0, b1] = split_range(blocks, member, n_members);
  const int64_t full_rows = m / kTileRows * kTileRows, tail = m - full_rows;
  if (full_rows > 0) {
    configure(16, 16);
    rows_by_blocks(x, ldx, data, pairs, 0, full_rows, b0, b1, y, ldy, accumulate);
  }
  if (tail > 0) {
    configure(int(std::min<int64_t>(tail, 16)), int(std::max<int64_t>(tail - 16, 0)));
    rows_by_blocks(x, ldx, data, pairs, full_rows, m, b0, b1, y, ldy, accumulate);
  }
  _tile_release();
  asm volatile("" ::: "memory");
}

}  // namespace ellm::amx
