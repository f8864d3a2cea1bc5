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

namespace {

// E4M3 codes to their exact BF16 values (every E4M3 value is a BF16 value) by table: vpermi2b
// (AVX-512-VBMI) looks a byte up among 128 with the code's low 7 bits, so two look-ups give each
// value's low and high byte, the sign bit goes in as it is, and two byte permutations put each
// column's two k side by side. 6 instructions per 64 weights, a third of the FP16 route
// (shifts, vcvtph2ps, scaling, narrowing) that kept FP8 decode below the read bandwidth.
class Fp8ToBf16 {
 public:
  Fp8ToBf16() {
    static const Tables tables;
    lo0_ = _mm512_loadu_si512(tables.lo), lo1_ = _mm512_loadu_si512(tables.lo + 64);
    hi0_ = _mm512_loadu_si512(tables.hi), hi1_ = _mm512_loadu_si512(tables.hi + 64);
    pick0_ = _mm512_loadu_si512(tables.pick[0]), pick1_ = _mm512_loadu_si512(tables.pick[1]);
  }

  // One k pair of a 32-column FP8 block as the two vectors of the BF16 layout above (columns
  // 0-15, then 16-31, each column's two k side by side): the codes of k = 2p at c, of 2p + 1 at
  // c + 32 (unless last: then zero).
  void pair(const uint8_t* c, bool last, __m512bh& w0, __m512bh& w1) const {
    const __m512i codes = last ? _mm512_maskz_loadu_epi8(0xffffffffull, c) : _mm512_loadu_si512(c);
    const __m512i lo = _mm512_permutex2var_epi8(lo0_, codes, lo1_);
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi0_, codes, hi1_), codes,
                                                 _mm512_set1_epi8(char(0x80)), 0xf8);  // hi | (codes & 0x80)
    w0 = (__m512bh)_mm512_permutex2var_epi8(lo, pick0_, hi);
    w1 = (__m512bh)_mm512_permutex2var_epi8(lo, pick1_, hi);
  }

 private:
  struct Tables {
    alignas(64) uint8_t lo[128], hi[128];  // the BF16 bits of code c (c < 128), byte by byte
    alignas(64) uint8_t pick[2][64];       // from lo (0-63) and hi (64-127): 4 bytes per column
    Tables() {
      for (int c = 0; c < 128; ++c) {
        const bf16 v = f32_to_bf16(fp8_e4m3_to_f32(uint8_t(c)));
        lo[c] = uint8_t(v & 0xff), hi[c] = uint8_t(v >> 8);
      }
      for (int half = 0; half < 2; ++half)
        for (int col = 0; col < 16; ++col) {
          const int c = 16 * half + col;  // k's code at byte c, k + 1's at 32 + c
          pick[half][4 * col + 0] = uint8_t(c);
          pick[half][4 * col + 1] = uint8_t(64 + c);
          pick[half][4 * col + 2] = uint8_t(32 + c);
          pick[half][4 * col + 3] = uint8_t(96 + c);
        }
    }
  };
  __m512i lo0_, lo1_, hi0_, hi1_, pick0_, pick1_;
};

// Columns [col0, col0 + cols) of FP8 weights w as their codes' values in the layout above
// (without the factors); `out` holds round_up(cols, 32) * (k + 1) elements.
void codes_to_packed_bf16(const PackedWeights& w, int64_t col0, int64_t cols, bf16* out) {
  static_assert(kFp8Cols == kCols);
  const int64_t k = w.k, pairs = (k + 1) / 2, blocks = (cols + kCols - 1) / kCols;
  const Fp8ToBf16 to_bf16;
  for (int64_t h = 0; h < blocks; ++h) {
    const uint8_t* codes = w.codes.get() + (col0 / kFp8Cols + h) * k * kFp8Cols;
    bf16* dst = out + h * pairs * 64;
    for (int64_t p = 0; p < pairs; ++p) {
      __m512bh w0, w1;
      to_bf16.pair(codes + 2 * p * kFp8Cols, 2 * p + 1 == k, w0, w1);
      _mm512_storeu_si512(dst + p * 64, (__m512i)w0);
      _mm512_storeu_si512(dst + p * 64 + 32, (__m512i)w1);
    }
  }
}

constexpr int kFp8DecodeRows = 4;
// A block's codes are one stream, read 64 bytes per k pair; asking for its lines this far ahead
// took one core's cold reads from 22-27 to 30-37 GB/s (Zen 5; the hardware's prefetch alone
// keeps too few lines in flight).
constexpr int64_t kFp8PrefetchBytes = 4096;

// Decode on FP8 weights, R rows of x against the NB 32-column blocks from b: per 128 k the
// rows' partial dot products from zero (vdpbf16ps on the codes' exact values, widened in
// registers), then y = partial * factor + y, one FMA per 128 k. The same arithmetic as tile() on
// the converted panel followed by add_scaled(), so a row's result is the same bits in any pass.
// Blocks side by side only interleave their independent sums: one row against one block is two
// chains of vdpbf16ps, which its latency, not the widening, held to 47 GB/s a core (Zen 5).
template <int R, int NB>
void fp8_decode_blocks(const bf16* x, int64_t ldx, const PackedWeights& w, int64_t b, float* y,
                       int64_t ldy, bool accumulate, const Fp8ToBf16& to_bf16) {
  const int64_t k = w.k;
  const uint8_t* codes[NB];
  __mmask16 mask[NB][2];
  __m512 out[NB][R][2];
#pragma GCC unroll 4
  for (int h = 0; h < NB; ++h) {
    const int64_t cols = w.n - (b + h) * kCols;
    codes[h] = w.codes.get() + (b + h) * k * kFp8Cols;
    mask[h][0] = column_mask(cols), mask[h][1] = column_mask(cols - 16);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half)
        out[h][r][half] = accumulate ? _mm512_maskz_loadu_ps(mask[h][half], y + r * ldy + h * kCols + 16 * half)
                                     : _mm512_setzero_ps();
  }
  for (int64_t kb = 0; kb < w.k_blocks; ++kb) {
    const int64_t k0 = kb * kFp8BlockK, len = std::min(kFp8BlockK, k - k0), pairs = len / 2;
    __m512 acc[NB][R][2];
#pragma GCC unroll 4
    for (int h = 0; h < NB; ++h)
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[h][r][0] = acc[h][r][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t kk = k0 + 2 * p;
#pragma GCC unroll 4
      for (int h = 0; h < NB; ++h) {
        // Past its block's end, the line of the block this one's stream reads next.
        const int64_t ahead = kk * kFp8Cols + kFp8PrefetchBytes;
        __builtin_prefetch(codes[h] + ahead + (ahead < k * kFp8Cols ? 0 : (NB - 1) * k * kFp8Cols));
        __m512bh w0, w1;
        to_bf16.pair(codes[h] + kk * kFp8Cols, false, w0, w1);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          __m512bh a = (__m512bh)broadcast_pair(x + r * ldx + kk);
          acc[h][r][0] = _mm512_dpbf16_ps(acc[h][r][0], a, w0);
          acc[h][r][1] = _mm512_dpbf16_ps(acc[h][r][1], a, w1);
        }
      }
    }
    if (len % 2) {  // the last k alone, as tile()'s odd tail: its partner is zero
      const int64_t kk = k0 + 2 * pairs;
#pragma GCC unroll 4
      for (int h = 0; h < NB; ++h) {
        __m512bh w0, w1;
        to_bf16.pair(codes[h] + kk * kFp8Cols, true, w0, w1);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          __m512bh a = (__m512bh)_mm512_set1_epi32(x[r * ldx + kk]);
          acc[h][r][0] = _mm512_dpbf16_ps(acc[h][r][0], a, w0);
          acc[h][r][1] = _mm512_dpbf16_ps(acc[h][r][1], a, w1);
        }
      }
    }
#pragma GCC unroll 4
    for (int h = 0; h < NB; ++h) {
      const __m512 factor = _mm512_set1_ps(w.scales[fp8_scale_index(w, (b + h) * kCols, kb)]);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        out[h][r][0] = _mm512_fmadd_ps(acc[h][r][0], factor, out[h][r][0]);
        out[h][r][1] = _mm512_fmadd_ps(acc[h][r][1], factor, out[h][r][1]);
      }
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < NB; ++h)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half)
        _mm512_mask_storeu_ps(y + r * ldy + h * kCols + 16 * half, mask[h][half], out[h][r][half]);
}

// Blocks taken side by side for 1-4 rows: enough independent sums to cover vdpbf16ps's latency.
constexpr int kFp8DecodeBlocks[kFp8DecodeRows + 1] = {0, 2, 2, 1, 1};
using Fp8DecodeFn = decltype(&fp8_decode_blocks<1, 1>);
constexpr Fp8DecodeFn kFp8Decode[kFp8DecodeRows + 1] = {nullptr, fp8_decode_blocks<1, 2>, fp8_decode_blocks<2, 2>,
                                                        fp8_decode_blocks<3, 1>, fp8_decode_blocks<4, 1>};
constexpr Fp8DecodeFn kFp8DecodeOne[kFp8DecodeRows + 1] = {nullptr, fp8_decode_blocks<1, 1>, fp8_decode_blocks<2, 1>,
                                                           fp8_decode_blocks<3, 1>, fp8_decode_blocks<4, 1>};

// y[R][cols] = part[R][32] * factor + (from_zero ? 0 : y): one FMA per element, as
// fp8_decode_blocks adds each 128 k's partial sums.
void add_scaled(const float* part, int64_t rows, float factor, float* y, int64_t ldy, int64_t cols,
                bool from_zero) {
  const __m512 f = _mm512_set1_ps(factor);
  const __mmask16 m0 = column_mask(cols), m1 = column_mask(cols - 16);
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * ldy;
    const float* pr = part + r * kCols;
    __m512 y0 = from_zero ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, yr);
    __m512 y1 = from_zero ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, yr + 16);
    _mm512_mask_storeu_ps(yr, m0, _mm512_fmadd_ps(_mm512_loadu_ps(pr), f, y0));
    _mm512_mask_storeu_ps(yr + 16, m1, _mm512_fmadd_ps(_mm512_loadu_ps(pr + 16), f, y1));
  }
}

}  // namespace

// FP8 weights, every row count with one arithmetic (a row's result never depends on its pass).
// Up to kFp8DecodeRows rows: fp8_decode_blocks, the codes widened in registers. More: the
// member's panels of columns (fp8_panel_width), each converted once to the BF16 layout above (the
// codes' exact values, without factors), then k in chunks of 128 through the BF16 tiles from
// zero, each chunk's result times its block's factor added to y (add_scaled).
void matmul_fp8(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
                int64_t ldy, bool accumulate, int member, int n_members,
                std::atomic<int64_t>* pool) {
  if (m <= kFp8DecodeRows) {
    share_work((w.n + kCols - 1) / kCols, member, n_members, pool, [&](int64_t b0, int64_t b1) {
      const Fp8ToBf16 to_bf16;
      const int64_t together = kFp8DecodeBlocks[m];
      int64_t b = b0;
      for (; b + together <= b1; b += together) kFp8Decode[m](x, ldx, w, b, y + b * kCols, ldy, accumulate, to_bf16);
      for (; b < b1; ++b) kFp8DecodeOne[m](x, ldx, w, b, y + b * kCols, ldy, accumulate, to_bf16);
    });
    return;
  }
  const int64_t k = w.k, pairs = (k + 1) / 2, width = fp8_panel_width(w.n, n_members);
  auto [p0, p1] = split_range((w.n + width - 1) / width, member, n_members);
  if (p0 == p1) return;
  bf16* panel = static_cast<bf16*>(thread_scratch(1, size_t(width * (k + 1)) * sizeof(bf16)));
  alignas(64) float part[kRows * kCols];
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t col0 = p * width, cols = std::min(width, w.n - col0);
    const int64_t blocks = (cols + kCols - 1) / kCols;
    codes_to_packed_bf16(w, col0, cols, panel);
    for (int64_t kb = 0; kb < w.k_blocks; ++kb) {
      const int64_t k0 = kb * kFp8BlockK, len = std::min(kFp8BlockK, k - k0);
      for (int64_t g0 = 0; g0 < m; g0 += kGroupRows) {
        const int64_t g1 = std::min(m, g0 + kGroupRows);
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t column = col0 + b * kCols;
          const float factor = w.scales[fp8_scale_index(w, column, kb)];
          const bf16* weights = panel + (b * pairs + k0 / 2) * 64;
          for (int64_t r0 = g0; r0 < g1; r0 += kRows) {
            const int64_t rows = std::min<int64_t>(kRows, g1 - r0);
            kTiles[rows](x + r0 * ldx + k0, ldx, weights, len / 2, len % 2, part, kCols, kCols, false);
            add_scaled(part, rows, factor, y + r0 * ldy + column, ldy, w.n - column, kb == 0 && !accumulate);
          }
        }
      }
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
