// AMX flash-attention block for prefill (contract of attention_block in kernel_table.h): the two
// products of a block, S = Q.K^T and O = P.V, run as BF16 tile products over the layouts of
// kernels/bf16_attention.h (the K^T and V packing there is the tiles' VNNI order); the online
// softmax stays in FP32 on AVX-512.
#include <immintrin.h>

#include "kernels/amx/amx.h"
#include "kernels/amx/amx_tiles.h"
#include "kernels/bf16_attention.h"

namespace ellm::amx {
namespace {

using namespace bf16_attention;

// Every tile 16 rows x 64 bytes.
void configure_full_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  load_tile_config(c);
}

// One block of at most 128 positions against the packed Q; tiles configured 16 x 64 bytes.
void block(const Scratch& w, const uint8_t* kt, const uint16_t* vb, int64_t group, int64_t rows,
           int64_t first_end, int64_t p0, int64_t p1, int64_t head_dim, float* m, float* l,
           float* acc) {
  const int64_t width = p1 - p0, steps = head_dim / 32;
  const int64_t row_tiles = (rows + 15) / 16, position_tiles = (width + 15) / 16;
  const int64_t pv_steps = (width + 31) / 32;
  uint16_t *qb = w.qb, *pb = w.pb;
  float* s = w.s;

  // S = Q.K^T, 16 rows at a time into tiles 0-3 (one per position tile).
  asm volatile("" ::: "memory");
  const int64_t qb_stride = head_dim * 2, s_stride = kPositions * 4;
  for (int64_t h = 0; h < row_tiles; ++h)
    for (int64_t g = 0; g < position_tiles; g += 4) {  // 4 position tiles in tiles 0-3
      const int64_t tiles = position_tiles - g;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t ks = 0; ks < steps; ++ks) {
        _tile_loadd(4, qb + h * 16 * head_dim + ks * 32, qb_stride);
        const uint8_t* kts = kt + (ks * kPositionTiles + g) * 1024;
        _tile_loadd(5, kts, 64);
        _tile_dpbf16ps(0, 4, 5);
        if (tiles > 1) {
          _tile_loadd(6, kts + 1024, 64);
          _tile_dpbf16ps(1, 4, 6);
        }
        if (tiles > 2) {
          _tile_loadd(7, kts + 2048, 64);
          _tile_dpbf16ps(2, 4, 7);
        }
        if (tiles > 3) {
          _tile_loadd(5, kts + 3072, 64);
          _tile_dpbf16ps(3, 4, 5);
        }
      }
      float* sh = s + h * 16 * kPositions + g * 16;
      _tile_stored(0, sh, s_stride);
      if (tiles > 1) _tile_stored(1, sh + 16, s_stride);
      if (tiles > 2) _tile_stored(2, sh + 32, s_stride);
      if (tiles > 3) _tile_stored(3, sh + 48, s_stride);
    }
  asm volatile("" ::: "memory");

  float correction[kRows];
  softmax_rows(w, group, rows, first_end, p0, p1, m, l, correction);

  // acc = acc * correction + P.V. Rescale only the rows whose maximum moved (after the first
  // blocks, few do), then add P.V with acc itself as the tile accumulator: acc is read and
  // written once per block. Padding rows of a tile have zero probabilities, so the tile writes
  // back what it read there.
  rescale_rows(correction, rows, head_dim, acc);
  asm volatile("" ::: "memory");
  const int64_t vb_stride = head_dim * 4, acc_stride = head_dim * 4, pb_stride = kPositions * 2;
  for (int64_t h = 0; h < row_tiles; ++h)
    for (int64_t d = 0; d < head_dim; d += 16) {
      float* a = acc + h * 16 * head_dim + d;
      _tile_loadd(0, a, acc_stride);
      for (int64_t kp = 0; kp < pv_steps; ++kp) {
        _tile_loadd(4, pb + h * 16 * kPositions + kp * 32, pb_stride);
        _tile_loadd(5, vb + kp * 16 * 2 * head_dim + 2 * d, vb_stride);
        _tile_dpbf16ps(0, 4, 5);
      }
      _tile_stored(0, a, acc_stride);
    }
  asm volatile("" ::: "memory");
}

}  // namespace

size_t attention_block_scratch_floats(int64_t head_dim) { return bf16_attention::scratch_floats(head_dim); }

void clear_attention_cache(float* s) { bf16_attention::clear_cache(s); }

void attention_block(const float* q, int64_t ldq, int64_t group, int64_t rows, int64_t first_end,
                     const void* k_cache, const void* v_cache, const float* k_factors,
                     const float* v_factors, int64_t ldkv, int64_t p0, int64_t p1,
                     int64_t head_dim, float scale, float* m, float* l, float* acc, float* s) {
  if (!bf16_attention::supports(head_dim, rows)) {
    avx512_kernels.attention_block(q, ldq, group, rows, first_end, k_cache, v_cache, k_factors,
                                   v_factors, ldkv, p0, p1, head_dim, scale, m, l, acc, s);
    return clear_attention_cache(s);
  }
  configure_full_tiles();
  bf16_attention::attention_blocks(
      q, ldq, group, rows, first_end, k_cache, v_cache, ldkv, p0, p1, head_dim, scale, s,
      [&](const Scratch& w, const uint8_t* kt, const uint16_t* vb, int64_t b0, int64_t b1) {
        block(w, kt, vb, group, rows, first_end, b0, b1, head_dim, m, l, acc);
      });
  _tile_release();
  asm volatile("" ::: "memory");
}

}  // namespace ellm::amx
