// AVX2/FMA matrix product. No BF16 arithmetic here: weights widen to FP32 by a 16-bit shift.
//
// Packed layout: output columns in blocks of 16; for each k the block's 16 weights side by side:
//   data[(block * k + kk) * 16 + col] = W[block * 16 + col][kk]   (missing columns zero)
// A micro-tile is up to kRows rows x 16 columns (12 accumulators). x is widened to FP32 once per
// (row group, k chunk) into a stack buffer and reused by every column block of the member.
// Decode (up to kRows rows) goes block by block over whole panels instead, so each member reads
// its weights as one front-to-back stream, left to the hardware prefetchers: software prefetch
// on top of them slowed batch-1 decode on AMD EPYC (as in the AVX-512 twin).
//
// Every output element is one FMA chain over k in order, started from y (accumulate) or zero,
// whatever the tile: a row's result is the same bits whether the product has 1 row or 1000 and
// wherever the row sits in it (one-shot prefill must equal chunked feeding). One row alone
// would wait on the FMA latency with a single block's two chains, so it takes kWide blocks at
// once (2 * kWide independent chains) instead of splitting k over several accumulators, which
// summed in another order than the multi-row tiles and made decode differ from prefill.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/threads.h"
#include "kernels/avx2/avx2.h"
#include "kernels/simd_elementwise.h"
#include "kernels/simd_fp8.h"
#include "kernels/vec_avx2.h"

namespace ellm::avx2 {
namespace {

constexpr int kCols = 16;
constexpr int kRows = 6;
constexpr int64_t kChunk = 256;                 // k per chunk
constexpr int64_t kGroupRows = 8 * kRows;       // x group: 48 x 256 floats = 48 KiB of stack

// The 16 outputs of one row and one block are two vectors, acc[0] (columns 0-7) and acc[1]; the
// helpers below are the only arithmetic on them, the same in every tile.
using Acc = __m256[2];

inline void load_acc(const float* y, bool load_y, Acc& acc) {
  acc[0] = load_y ? _mm256_loadu_ps(y) : _mm256_setzero_ps();
  acc[1] = load_y ? _mm256_loadu_ps(y + 8) : _mm256_setzero_ps();
}

inline void store_acc(float* y, const Acc& acc) {
  _mm256_storeu_ps(y, acc[0]);
  _mm256_storeu_ps(y + 8, acc[1]);
}

// The block's 16 weights of one k (wk), widened to FP32.
inline void load_weights(const bf16* wk, __m256& w0, __m256& w1) {
  w0 = Avx2Vec::load_bf16(wk, 8);
  w1 = Avx2Vec::load_bf16(wk + 8, 8);
}

inline void fma_step(__m256 a, __m256 w0, __m256 w1, Acc& acc) {
  acc[0] = _mm256_fmadd_ps(a, w0, acc[0]);
  acc[1] = _mm256_fmadd_ps(a, w1, acc[1]);
}

// y[R][cols] (=|+=) xf[R][len] . W-block (w at the chunk's first k); xf rows ldxf apart.
template <int R>
void tile(const float* xf, int64_t ldxf, const bf16* w, int64_t len, float* y, int64_t ldy,
          int64_t cols, bool load_y) {
  float edge[R * kCols];  // partial last block: work on a copy of the valid columns
  float* out = y;
  int64_t ld = ldy;
  if (cols < kCols) {
    out = edge, ld = kCols;
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < kCols; ++c) edge[r * kCols + c] = load_y && c < cols ? y[r * ldy + c] : 0;
  }
  Acc acc[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) load_acc(out + r * ld, load_y || out == edge, acc[r]);
  for (int64_t kk = 0; kk < len; ++kk) {
    __m256 w0, w1;
    load_weights(w + kk * kCols, w0, w1);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) fma_step(_mm256_broadcast_ss(xf + r * ldxf + kk), w0, w1, acc[r]);
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) store_acc(out + r * ld, acc[r]);
  if (out == edge)
    for (int r = 0; r < R; ++r) std::memcpy(y + r * ldy, edge + r * kCols, cols * sizeof(float));
}

// One row x kWide whole column blocks (y[0][kWide * kCols]); w is the first block's panel at the
// chunk's first k, the next blocks' panels ldw elements apart. Same arithmetic per element as tile<1>.
constexpr int kWide = 4;
void row_wide(const float* xf, const bf16* w, int64_t ldw, int64_t len, float* y, bool load_y) {
  Acc acc[kWide];
#pragma GCC unroll 4
  for (int b = 0; b < kWide; ++b) load_acc(y + b * kCols, load_y, acc[b]);
  for (int64_t kk = 0; kk < len; ++kk) {
    __m256 a = _mm256_broadcast_ss(xf + kk), w0, w1;
#pragma GCC unroll 4
    for (int b = 0; b < kWide; ++b) {
      load_weights(w + b * ldw + kk * kCols, w0, w1);
      fma_step(a, w0, w1, acc[b]);
    }
  }
#pragma GCC unroll 4
  for (int b = 0; b < kWide; ++b) store_acc(y + b * kCols, acc[b]);
}

using TileFn = decltype(&tile<1>);
constexpr TileFn kTiles[kRows + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

}  // namespace

void pack_weights(const bf16* w, int64_t n, int64_t k, PackedWeights& out) {
  int64_t blocks = (n + kCols - 1) / kCols;
  size_t count = size_t(blocks * k * kCols);
  out.data = make_buffer<bf16>(count);
  out.bytes = count * sizeof(bf16);
  bf16* dst = out.data.get();
  for (int64_t j = 0; j < n; ++j)
    for (int64_t kk = 0; kk < k; ++kk) dst[((j / kCols) * k + kk) * kCols + j % kCols] = w[j * k + kk];
}

namespace {

// Columns [col0, col0 + cols) of FP8 weights w as their codes' values in the layout above, exactly
// (every E4M3 value is a BF16 value): each 16-column block is half of an FP8 block; 16 codes
// widen to 2 vectors (times 2^-8, undone here) and narrow by truncation, which is exact.
void codes_to_bf16(const PackedWeights& w, int64_t col0, int64_t cols, bf16* out) {
  const int64_t k = w.k, blocks = (cols + kCols - 1) / kCols;
  const __m256 undo = _mm256_set1_ps(256.0f);
  for (int64_t h = 0; h < blocks; ++h) {
    const int64_t column = col0 + h * kCols;
    const uint8_t* codes = w.codes.get() + (column / kFp8Cols) * k * kFp8Cols + column % kFp8Cols;
    bf16* dst = out + h * k * kCols;
    for (int64_t kk = 0; kk < k; ++kk) {
      __m256 lo, hi;
      Avx2Vec::load_fp8_x2(codes + kk * kFp8Cols, lo, hi);
      __m256i packed =
          _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(_mm256_mul_ps(lo, undo)), 16),
                              _mm256_srli_epi32(_mm256_castps_si256(_mm256_mul_ps(hi, undo)), 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + kk * kCols),
                          _mm256_permute4x64_epi64(packed, 0xd8));  // undo packus' lane order
    }
  }
}

// y[R][cols] = part[R][16] * factors[16] + (from_zero ? 0 : y): one FMA per element, as the
// FP8 decode kernel adds each block's partial sums.
void add_scaled(const float* part, int64_t rows, const float* factors, float* y, int64_t ldy,
                int64_t cols, bool from_zero) {
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * ldy;
    const float* pr = part + r * kCols;
    if (cols == kCols) {
      for (int v = 0; v < 2; ++v) {
        __m256 base = from_zero ? _mm256_setzero_ps() : _mm256_loadu_ps(yr + 8 * v);
        _mm256_storeu_ps(yr + 8 * v, _mm256_fmadd_ps(_mm256_loadu_ps(pr + 8 * v),
                                                     _mm256_loadu_ps(factors + 8 * v), base));
      }
    } else {
      for (int64_t c = 0; c < cols; ++c)
        yr[c] = std::fma(pr[c], factors[c], from_zero ? 0.0f : yr[c]);
    }
  }
}

// Columns [col0, col0 + cols) of W, y at the first of them (=|+=) x . W, where `panel` holds those columns of W in the
// layout above as values before their factors, which apply per `step` inputs: each step's
// product from zero through the BF16 tiles, then times the columns' factors for the step
// (factors(column, s): the 16 of the 16-column block at `column`) added to y. inputs(r0, rows,
// k0, xf) writes rows [r0, r0 + rows) of x over inputs [k0, k0 + step) as FP32, `step` apart.
template <class Inputs, class Factors>
void scaled_panel_product(int64_t m, const bf16* panel, int64_t k, int64_t step, int64_t col0,
                          int64_t cols, Inputs&& inputs, Factors&& factors, float* y, int64_t ldy,
                          bool accumulate) {
  const int64_t blocks = (cols + kCols - 1) / kCols;
  float* xf = static_cast<float*>(thread_scratch(0, size_t(kGroupRows * step) * sizeof(float)));
  alignas(32) float part[kRows * kCols];
  for (int64_t k0 = 0; k0 < k; k0 += step) {
    const int64_t len = std::min(step, k - k0);
    for (int64_t g0 = 0; g0 < m; g0 += kGroupRows) {
      const int64_t g1 = std::min(m, g0 + kGroupRows);
      inputs(g0, g1 - g0, k0, xf);
      for (int64_t b = 0; b < blocks; ++b) {
        const float* f = factors(col0 + b * kCols, k0 / step);
        const bf16* weights = panel + (b * k + k0) * kCols;
        for (int64_t r0 = g0; r0 < g1; r0 += kRows) {
          const int64_t rows = std::min<int64_t>(kRows, g1 - r0);
          kTiles[rows](xf + (r0 - g0) * step, step, weights, len, part, kCols, kCols, false);
          add_scaled(part, rows, f, y + r0 * ldy + b * kCols, ldy,
                     std::min<int64_t>(kCols, cols - b * kCols), k0 == 0 && !accumulate);
        }
      }
    }
  }
}

}  // namespace

// FP8 weights. Up to simd::kFp8DecodeRows rows: the shared decode kernel. More: the member's
// panels of columns (fp8_panel_width), each converted once to the BF16 layout above (the codes'
// values, without factors), then k in chunks of 128 through the BF16 tiles, each chunk's result
// times its block's factor added to y. That is the decode kernel's arithmetic (per 128 k one FMA
// chain from zero, then one FMA into y), so a row's result is the same bits in any pass.
void matmul_fp8(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
                int64_t ldy, bool accumulate, int member, int n_members,
                std::atomic<int64_t>* pool) {
  if (m <= simd::kFp8DecodeRows)
    return simd::matmul_fp8<Avx2Vec>(x, m, ldx, w, y, ldy, accumulate, member, n_members, pool);
  const int64_t k = w.k, width = fp8_panel_width(w.n, n_members);
  auto [p0, p1] = split_range((w.n + width - 1) / width, member, n_members);
  if (p0 == p1) return;
  bf16* panel = static_cast<bf16*>(thread_scratch(1, size_t(width * k) * sizeof(bf16)));
  auto inputs = [&](int64_t r0, int64_t rows, int64_t k0, float* xf) {
    for (int64_t r = 0; r < rows; ++r)
      simd::convert_bf16_to_f32<Avx2Vec>(x + (r0 + r) * ldx + k0, xf + r * kFp8BlockK,
                                         std::min(kFp8BlockK, k - k0));
  };
  alignas(32) float factors[kCols];
  auto factors_of = [&](int64_t column, int64_t kb) {
    std::fill_n(factors, kCols, w.scales[fp8_scale_index(w, column, kb)]);
    return factors;
  };
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t col0 = p * width, cols = std::min(width, w.n - col0);
    codes_to_bf16(w, col0, cols, panel);
    scaled_panel_product(m, panel, k, kFp8BlockK, col0, cols, inputs, factors_of, y + col0, ldy,
                         accumulate);
  }
}

void matmul(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y, int64_t ldy,
            bool accumulate, int member, int n_members, std::atomic<int64_t>* pool) {
  int64_t blocks = (w.n + kCols - 1) / kCols;
  alignas(32) float xf[kGroupRows * kChunk];
  if (m <= kRows) {
    // Decode: each block's panel whole, so the member streams its weights front to back (k in
    // chunks that fill the buffer: one chunk up to k = 12288 for one row).
    const int64_t chunk = kGroupRows * kChunk / m / 8 * 8;
    share_work(blocks, member, n_members, pool, [&](int64_t b0, int64_t b1) {
      for (int64_t c0 = 0; c0 < w.k; c0 += chunk) {
        int64_t len = std::min(chunk, w.k - c0);
        for (int64_t r = 0; r < m; ++r) simd::convert_bf16_to_f32<Avx2Vec>(x + r * ldx + c0, xf + r * chunk, len);
        bool load_y = accumulate || c0 > 0;
        for (int64_t b = b0; b < b1;) {
          const bf16* panel = w.data.get() + (b * w.k + c0) * kCols;
          if (m == 1 && b + kWide <= b1 && (b + kWide) * kCols <= w.n) {  // whole blocks only
            row_wide(xf, panel, w.k * kCols, len, y + b * kCols, load_y);
            b += kWide;
          } else {
            kTiles[m](xf, chunk, panel, len, y + b * kCols, ldy, w.n - b * kCols, load_y);
            ++b;
          }
        }
      }
    });
    return;
  }
  auto [b0, b1] = split_range(blocks, member, n_members);
  if (b0 == b1) return;
  for (int64_t c0 = 0; c0 < w.k; c0 += kChunk) {
    int64_t len = std::min(kChunk, w.k - c0);
    bool load_y = accumulate || c0 > 0;
    for (int64_t g0 = 0; g0 < m; g0 += kGroupRows) {
      int64_t g1 = std::min(m, g0 + kGroupRows);
      for (int64_t r = g0; r < g1; ++r) simd::convert_bf16_to_f32<Avx2Vec>(x + r * ldx + c0, xf + (r - g0) * kChunk, len);
      for (int64_t b = b0; b < b1; ++b) {
        const bf16* panel = w.data.get() + (b * w.k + c0) * kCols;
        for (int64_t r0 = g0; r0 < g1; r0 += kRows) {
          int64_t rows = std::min<int64_t>(kRows, g1 - r0);
          kTiles[rows](xf + (r0 - g0) * kChunk, kChunk, panel, len, y + r0 * ldy + b * kCols,
                       ldy, w.n - b * kCols, load_y);
        }
      }
    }
  }
}

}  // namespace ellm::avx2
