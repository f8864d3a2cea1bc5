// AVX-512 BF16 matrix product (vdpbf16ps).
//
// Packed layout: output columns in blocks of 32; inside a block, k in pairs, and for each pair
// the 32 columns' two weights side by side (VNNI order):
//   data[((block * k_pairs) + pair) * 64 + col * 2 + t] = W[block * 32 + col][pair * 2 + t]
// so one k pair of a block is two 64-byte vectors, and a block is one contiguous stream.
// Missing columns and the odd k are zero.
//
// A micro-tile is up to kRows rows x 32 columns in 2 * kRows accumulators: per k pair it loads
// the two weight vectors once and for each row broadcasts the row's x pair into vdpbf16ps.
// Decode (m <= kRows): one pass per block over all of k; a member's blocks are one stream that
// the hardware prefetchers follow. Software prefetch on top of them (2 KiB ahead, which this
// kernel used to issue) competes with them on AMD EPYC (Zen 5) and slowed the weight stream.
// Prefill: k in chunks of kChunkPairs, rows in groups of kGroupRows, so a group's x chunk stays
// in L2 while every block's weight panel (32 columns x chunk) passes by, and each panel stays in
// L1 while all the group's row tiles use it.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/threads.h"
#include "kernels/avx512/avx512.h"

namespace ellm::avx512 {
namespace {

constexpr int kCols = 32;
constexpr int kRows = 12;
constexpr int64_t kChunkPairs = 256;
constexpr int64_t kGroupRows = 16 * kRows;

inline __m512i broadcast_pair(const bf16* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

inline __mmask16 column_mask(int64_t valid) {
  if (valid >= 16) return 0xffff;
  return valid <= 0 ? 0 : __mmask16((1u << valid) - 1);
}

// y[R][cols] (=|+=) x[R][2 * pairs (+1 when odd_tail)] . W-block; w is the block at its first
// pair, x at the matching k.
template <int R>
void tile(const bf16* x, int64_t ldx, const bf16* w, int64_t pairs, bool odd_tail, float* y,
          int64_t ldy, int64_t cols, bool load_y) {
  __mmask16 m0 = column_mask(cols), m1 = column_mask(cols - 16);
  __m512 acc[R][2];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    acc[r][0] = load_y ? _mm512_maskz_loadu_ps(m0, y + r * ldy) : _mm512_setzero_ps();
    acc[r][1] = load_y ? _mm512_maskz_loadu_ps(m1, y + r * ldy + 16) : _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    const bf16* wp = w + p * 64;
    __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp);
    __m512bh w1 = (__m512bh)_mm512_loadu_si512(wp + 32);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      __m512bh a = (__m512bh)broadcast_pair(x + r * ldx + 2 * p);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, w1);
    }
  }
  if (odd_tail) {  // the last k alone; its pair partner in W is zero
    const bf16* wp = w + pairs * 64;
    __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp);
    __m512bh w1 = (__m512bh)_mm512_loadu_si512(wp + 32);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      __m512bh a = (__m512bh)_mm512_set1_epi32(x[r * ldx + 2 * pairs]);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, w1);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, m0, acc[r][0]);
    _mm512_mask_storeu_ps(y + r * ldy + 16, m1, acc[r][1]);
  }
}

using TileFn = decltype(&tile<1>);
constexpr TileFn kTiles[kRows + 1] = {nullptr,  tile<1>, tile<2>, tile<3>,  tile<4>,
                                      tile<5>,  tile<6>, tile<7>, tile<8>,  tile<9>,
                                      tile<10>, tile<11>, tile<12>};

}  // namespace

void pack_weights(const bf16* w, int64_t n, int64_t k, PackedWeights& out) {
  int64_t blocks = (n + kCols - 1) / kCols, pairs = (k + 1) / 2;
  size_t count = size_t(blocks * pairs * 64);
  out.data = make_buffer<bf16>(count);
  out.bytes = count * sizeof(bf16);
  bf16* dst = out.data.get();
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t col = 0; col < kCols && b * kCols + col < n; ++col) {
      const bf16* row = w + (b * kCols + col) * k;
      for (int64_t kk = 0; kk < k; ++kk)
        dst[(b * pairs + kk / 2) * 64 + col * 2 + kk % 2] = row[kk];
    }
}

// Into the layout above, element by element (kFp8Cols == kCols: one FP8 block per block).
void fp8_to_packed_bf16(const PackedWeights& w, int64_t col0, int64_t cols, PackedWeights& out) {
  static_assert(kFp8Cols == kCols);
  const int64_t k = w.k, pairs = (k + 1) / 2, blocks = (cols + kCols - 1) / kCols;
  out.n = cols;
  out.k = k;
  out.isa = Isa::avx512;
  out.bytes = size_t(blocks * pairs * 64) * sizeof(bf16);
  float values[256];
  for (int code = 0; code < 256; ++code) values[code] = fp8_e4m3_to_f32(uint8_t(code));
  for (int64_t h = 0; h < blocks; ++h) {
    const int64_t b = col0 / kFp8Cols + h;
    const uint8_t* codes = w.codes.get() + b * k * kFp8Cols;
    bf16* dst = out.data.get() + h * pairs * 64;
    if (k % 2) std::fill_n(dst + (pairs - 1) * 64, 64, bf16(0));  // the odd k's zero partner
    for (int64_t kk = 0; kk < k; ++kk) {
      const float factor = w.scales[b * w.k_blocks + kk / kFp8BlockK];
      for (int64_t c = 0; c < kCols; ++c)
        dst[(kk / 2) * 64 + c * 2 + kk % 2] = f32_to_bf16(values[codes[kk * kFp8Cols + c]] * factor);
    }
  }
}

void matmul(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y, int64_t ldy,
            bool accumulate, int member, int n_members, std::atomic<int64_t>* pool) {
  int64_t blocks = (w.n + kCols - 1) / kCols, pairs = (w.k + 1) / 2;
  int64_t full_pairs = w.k / 2;
  bool odd = w.k % 2;
  const bf16* data = w.data.get();

  if (m <= kRows) {
    share_work(blocks, member, n_members, pool, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b)
        kTiles[m](x, ldx, data + b * pairs * 64, full_pairs, odd, y + b * kCols, ldy,
                  w.n - b * kCols, accumulate);
    });
    return;
  }
  auto [b0, b1] = split_range(blocks, member, n_members);
  for (int64_t c0 = 0; c0 == 0 || c0 < full_pairs; c0 += kChunkPairs) {
    int64_t chunk = std::min(kChunkPairs, full_pairs - c0);
    bool last = c0 + chunk >= full_pairs, load_y = accumulate || c0 > 0;
    for (int64_t g0 = 0; g0 < m; g0 += kGroupRows) {
      int64_t g1 = std::min(m, g0 + kGroupRows);
      for (int64_t b = b0; b < b1; ++b) {
        const bf16* panel = data + (b * pairs + c0) * 64;
        for (int64_t r0 = g0; r0 < g1; r0 += kRows) {
          int64_t rows = std::min<int64_t>(kRows, g1 - r0);
          kTiles[rows](x + r0 * ldx + 2 * c0, ldx, panel, chunk, odd && last,
                       y + r0 * ldy + b * kCols, ldy, w.n - b * kCols, load_y);
        }
      }
    }
  }
}

}  // namespace ellm::avx512
