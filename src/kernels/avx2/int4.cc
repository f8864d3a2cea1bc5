// AVX2 INT4 weights (layout and arithmetic in kernels.h): the decode product, which widens the
// codes in registers, and the conversion of a panel of columns to the BF16 layout of
// avx2/matmul.cc, which the prefill product there runs its tiles on.
//
// A code becomes q - zero in integer steps and one exact conversion: one byte shuffle puts 8
// code bytes one per 32-bit lane (columns c and c + 16 of the block share a byte), a mask or a
// shift keeps one nibble, the zero point comes off as an integer and the difference converts
// exactly to FP32. (Widening through F16C, as the FP8 kernel does, ran at half the speed.)
#include <immintrin.h>

#include <algorithm>

#include "base/threads.h"
#include "kernels/avx2/avx2.h"
#include "kernels/simd_elementwise.h"
#include "kernels/vec_avx2.h"

namespace ellm::avx2 {
namespace {

constexpr int kDecodeRows = 4;

// One k's 16 code bytes, in both 128-bit lanes.
inline __m256i load_codes(const uint8_t* p) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Bytes 0-7 (first) and 8-15 (second) of the codes, one per 32-bit lane: the codes of columns
// 0-7 and 8-15 in their low nibbles, of 16-23 and 24-31 in their high ones.
inline void spread(__m256i bytes, __m256i& first, __m256i& second) {
  const __m256i pick0 = _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1,
                                         4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1);
  const __m256i pick1 = _mm256_add_epi32(pick0, _mm256_set1_epi32(8));
  first = _mm256_shuffle_epi8(bytes, pick0);
  second = _mm256_shuffle_epi8(bytes, pick1);
}

// The zero points of 8 columns as 32-bit integers.
inline __m256i zeros_of(const uint8_t* zeros) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(zeros)));
}

// Half kHalf (0: columns 0-15, the low nibbles; 1: columns 16-31) of the spread codes as two
// vectors of q - zero; zero[0], zero[1]: the half's columns 0-7 and 8-15.
template <int kHalf>
inline void widen(__m256i first, __m256i second, const __m256i* zero, __m256& lo, __m256& hi) {
  auto nibble = [](__m256i b) {
    return kHalf ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(15));
  };
  lo = _mm256_cvtepi32_ps(_mm256_sub_epi32(nibble(first), zero[0]));
  hi = _mm256_cvtepi32_ps(_mm256_sub_epi32(nibble(second), zero[1]));
}

// One group of kBlocks blocks (codes ldc bytes apart, factors and zeros ldp apart, out R x 32
// floats apart) for rows r < R and halves [kHalf0, kHalf0 + kHalves): per column a partial sum
// of xf (rows ldxf apart, at the group's first input) times q - zero, from zero in k order, then
// out[r][column] = partial * factor + out[r][column]; out is [R][32] per block.
template <int R, int kBlocks, int kHalves, int kHalf0>
void group_tile(const float* xf, int64_t ldxf, const uint8_t* codes, int64_t ldc, int64_t len,
                const float* scales, const uint8_t* zeros, int64_t ldp, float* out) {
  constexpr int kVecs = 2 * kHalves;
  __m256i zero[kBlocks][kVecs];
#pragma GCC unroll 2
  for (int j = 0; j < kBlocks; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) zero[j][v] = zeros_of(zeros + j * ldp + 16 * kHalf0 + 8 * v);
  __m256 partial[kBlocks][R][kVecs];
#pragma GCC unroll 2
  for (int j = 0; j < kBlocks; ++j)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) partial[j][r][v] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < len; ++kk) {
#pragma GCC unroll 2
    for (int j = 0; j < kBlocks; ++j) {
      __m256i first, second;
      spread(load_codes(codes + j * ldc + kk * 16), first, second);
      __m256 w[kVecs];
      widen<kHalf0>(first, second, zero[j], w[0], w[1]);
      if constexpr (kHalves == 2) widen<1>(first, second, zero[j] + 2, w[2], w[3]);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 a = _mm256_broadcast_ss(xf + r * ldxf + kk);
#pragma GCC unroll 4
        for (int v = 0; v < kVecs; ++v)
          partial[j][r][v] = _mm256_fmadd_ps(a, w[v], partial[j][r][v]);
      }
    }
  }
#pragma GCC unroll 2
  for (int j = 0; j < kBlocks; ++j)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) {
        const int column = 16 * kHalf0 + 8 * v;
        float* o = out + (j * R + r) * kInt4Cols + column;
        const __m256 factor = _mm256_loadu_ps(scales + j * ldp + column);
        _mm256_storeu_ps(o, _mm256_fmadd_ps(partial[j][r][v], factor, _mm256_loadu_ps(o)));
      }
}

// One group of one block for R rows: one row takes the whole block (4 FMA chains), more rows
// take it a half at a time so that their partial sums stay in registers.
template <int R>
void group_rows(const float* xf, int64_t ldxf, const uint8_t* codes, int64_t len,
                const float* scales, const uint8_t* zeros, float* out) {
  if constexpr (R == 1) {
    group_tile<1, 1, 2, 0>(xf, ldxf, codes, 0, len, scales, zeros, 0, out);
  } else {
    group_tile<R, 1, 1, 0>(xf, ldxf, codes, 0, len, scales, zeros, 0, out);
    group_tile<R, 1, 1, 1>(xf, ldxf, codes, 0, len, scales, zeros, 0, out);
  }
}

}  // namespace

// Rows of x as FP32, inputs in the weights' order (k_order when given).
void int4_inputs(const bf16* x, int64_t ldx, int64_t rows, const PackedWeights& w, int64_t k0,
                 int64_t len, float* xf, int64_t ldxf) {
  const int32_t* order = w.k_order.get();
  for (int64_t r = 0; r < rows; ++r) {
    const bf16* xr = x + r * ldx;
    float* out = xf + r * ldxf;
    if (!order) {
      simd::convert_bf16_to_f32<Avx2Vec>(xr + k0, out, len);
    } else {
      for (int64_t kk = 0; kk < len; ++kk) out[kk] = bf16_to_f32(xr[order[k0 + kk]]);
    }
  }
}

void int4_decode(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
                 int64_t ldy, bool accumulate, int member, int n_members,
                 std::atomic<int64_t>* pool) {
  const int64_t k = w.k, G = w.group, blocks = (w.n + kInt4Cols - 1) / kInt4Cols;
  float* xf = static_cast<float*>(thread_scratch(0, size_t(m * k) * sizeof(float)));
  int4_inputs(x, ldx, m, w, 0, k, xf, k);
  constexpr decltype(&group_rows<1>) by_rows[] = {group_rows<1>, group_rows<2>, group_rows<3>,
                                                  group_rows<4>};
  share_work(blocks, member, n_members, pool, [&](int64_t b0, int64_t b1) {
    alignas(32) float out[kDecodeRows * kInt4Cols];  // [block or row][32]
    for (int64_t b = b0; b < b1;) {
      // One row takes 2 blocks at once: 8 independent FMA chains instead of 4, each chain in
      // the same order as alone.
      const int64_t together = m == 1 && b + 1 < b1 ? 2 : 1;  // blocks at once
      const int64_t ldc = k * 16, ldp = w.groups * kInt4Cols;
      for (int64_t j = 0; j < together; ++j)
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < kInt4Cols; ++c) {
            const int64_t column = (b + j) * kInt4Cols + c;
            out[(j + r) * kInt4Cols + c] = accumulate && column < w.n ? y[r * ldy + column] : 0;
          }
      const uint8_t* codes = w.codes.get() + b * ldc;
      for (int64_t g = 0; g < w.groups; ++g) {
        const size_t params = size_t(b * ldp + g * kInt4Cols);
        if (together == 2)
          group_tile<1, 2, 2, 0>(xf + g * G, k, codes + g * G * 16, ldc, G, w.scales.get() + params,
                                 w.zeros.get() + params, ldp, out);
        else
          by_rows[m - 1](xf + g * G, k, codes + g * G * 16, G, w.scales.get() + params,
                         w.zeros.get() + params, out);
      }
      for (int64_t j = 0; j < together; ++j)
        for (int64_t r = 0; r < m; ++r) {
          const int64_t column = (b + j) * kInt4Cols;
          std::copy_n(out + (j + r) * kInt4Cols, std::min(kInt4Cols, w.n - column),
                      y + r * ldy + column);
        }
      b += together;
    }
  });
}

int64_t int4_decode_rows() { return kDecodeRows; }

// Columns [col0, col0 + cols) (col0 a multiple of 32) as q - zero in BF16 (exact: small
// integers), in blocks of 16 columns, each k's 16 values side by side; missing columns 0.
void int4_to_bf16(const PackedWeights& w, int64_t col0, int64_t cols, bf16* out) {
  const int64_t k = w.k, G = w.group, blocks = (cols + kInt4Cols - 1) / kInt4Cols;
  auto narrow = [](__m256 lo, __m256 hi, bf16* dst) {  // truncation: exact for these values
    const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(lo), 16),
                                               _mm256_srli_epi32(_mm256_castps_si256(hi), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_permute4x64_epi64(packed, 0xd8));
  };
  for (int64_t h = 0; h < blocks; ++h) {
    const int64_t b = col0 / kInt4Cols + h;
    const uint8_t* codes = w.codes.get() + b * k * 16;
    bf16* low = out + 2 * h * k * 16;  // columns 0-15 of the block, then 16-31
    bf16* high = low + k * 16;
    for (int64_t g = 0; g < w.groups; ++g) {
      const uint8_t* zeros = w.zeros.get() + (b * w.groups + g) * kInt4Cols;
      const __m256i zero[4] = {zeros_of(zeros), zeros_of(zeros + 8), zeros_of(zeros + 16),
                               zeros_of(zeros + 24)};
      for (int64_t kk = g * G; kk < (g + 1) * G; ++kk) {
        __m256i first, second;
        spread(load_codes(codes + kk * 16), first, second);
        __m256 lo, hi;
        widen<0>(first, second, zero, lo, hi);
        narrow(lo, hi, low + kk * 16);
        widen<1>(first, second, zero + 2, lo, hi);
        narrow(lo, hi, high + kk * 16);
      }
    }
  }
}

}  // namespace ellm::avx2
