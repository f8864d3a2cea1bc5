// AVX2 INT4 weights (layout and arithmetic in kernels.h): the decode product, which widens the
// codes in registers, and the conversion of a panel of columns to the BF16 layout of
// avx2/matmul.cc, which the prefill product there runs its tiles on.
//
// A code becomes q - zero in two integer steps and one exact float one: q plus the column's
// bias (the FP16 bits of 1536 - zero) is the FP16 of 1536 + q - zero, whose exponent steps by
// exactly 1 over [1024, 2048); F16C widens it and 1536 comes off without rounding.
#include <immintrin.h>

#include <algorithm>

#include "base/threads.h"
#include "kernels/avx2/avx2.h"
#include "kernels/simd_elementwise.h"
#include "kernels/vec_avx2.h"

namespace ellm::avx2 {
namespace {

constexpr int kDecodeRows = 4;

// The 16 per-column biases of a half block from its 16 zero points.
inline __m256i bias_of(const uint8_t* zeros) {
  const __m128i z = _mm_loadu_si128(reinterpret_cast<const __m128i*>(zeros));
  return _mm256_sub_epi16(_mm256_set1_epi16(0x6600), _mm256_cvtepu8_epi16(z));
}

// Half kHalf (0: columns 0-15, the low nibbles; 1: columns 16-31) of one k's 16 code bytes as
// two vectors of q - zero.
template <int kHalf>
inline void widen(__m128i bytes, __m256i bias, __m256& lo, __m256& hi) {
  const __m128i nibble = _mm_set1_epi8(15);
  const __m128i q = kHalf ? _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble)
                          : _mm_and_si128(bytes, nibble);
  const __m256i h = _mm256_add_epi16(_mm256_cvtepu8_epi16(q), bias);
  const __m256 offset = _mm256_set1_ps(1536.0f);
  lo = _mm256_sub_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), offset);
  hi = _mm256_sub_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), offset);
}

inline __m128i load_codes(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// One group of one block for rows r < R and halves [kHalf0, kHalf0 + kHalves): per column a
// partial sum of xf (rows ldxf apart, at the group's first input) times q - zero, from zero in
// k order, then out[r][column] = partial * factor + out[r][column]; out is [R][32].
template <int R, int kHalves, int kHalf0>
void group_tile(const float* xf, int64_t ldxf, const uint8_t* codes, int64_t len,
                const float* scales, const uint8_t* zeros, float* out) {
  constexpr int kVecs = 2 * kHalves;
  __m256i bias[kHalves];
#pragma GCC unroll 2
  for (int h = 0; h < kHalves; ++h) bias[h] = bias_of(zeros + 16 * (kHalf0 + h));
  __m256 partial[R][kVecs];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) partial[r][v] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < len; ++kk) {
    const __m128i bytes = load_codes(codes + kk * 16);
    __m256 w[kVecs];
    widen<kHalf0>(bytes, bias[0], w[0], w[1]);
    if constexpr (kHalves == 2) widen<1>(bytes, bias[1], w[2], w[3]);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(xf + r * ldxf + kk);
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) partial[r][v] = _mm256_fmadd_ps(a, w[v], partial[r][v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      const int column = 16 * kHalf0 + 8 * v;
      float* o = out + r * kInt4Cols + column;
      _mm256_storeu_ps(o, _mm256_fmadd_ps(partial[r][v], _mm256_loadu_ps(scales + column),
                                          _mm256_loadu_ps(o)));
    }
}

// One group of one block for R rows: one row takes the whole block (4 FMA chains), more rows
// take it a half at a time so that their partial sums stay in registers.
template <int R>
void group_rows(const float* xf, int64_t ldxf, const uint8_t* codes, int64_t len,
                const float* scales, const uint8_t* zeros, float* out) {
  if constexpr (R == 1) {
    group_tile<1, 2, 0>(xf, ldxf, codes, len, scales, zeros, out);
  } else {
    group_tile<R, 1, 0>(xf, ldxf, codes, len, scales, zeros, out);
    group_tile<R, 1, 1>(xf, ldxf, codes, len, scales, zeros, out);
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
    alignas(32) float out[kDecodeRows * kInt4Cols];  // [row][32]
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t cols = std::min(kInt4Cols, w.n - b * kInt4Cols);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < kInt4Cols; ++c)
          out[r * kInt4Cols + c] = accumulate && c < cols ? y[r * ldy + b * kInt4Cols + c] : 0;
      const uint8_t* codes = w.codes.get() + b * k * 16;
      for (int64_t g = 0; g < w.groups; ++g) {
        const size_t params = size_t((b * w.groups + g) * kInt4Cols);
        by_rows[m - 1](xf + g * G, k, codes + g * G * 16, G, w.scales.get() + params,
                       w.zeros.get() + params, out);
      }
      for (int64_t r = 0; r < m; ++r)
        std::copy_n(out + r * kInt4Cols, cols, y + r * ldy + b * kInt4Cols);
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
      const __m256i bias0 = bias_of(zeros), bias1 = bias_of(zeros + 16);
      for (int64_t kk = g * G; kk < (g + 1) * G; ++kk) {
        const __m128i bytes = load_codes(codes + kk * 16);
        __m256 lo, hi;
        widen<0>(bytes, bias0, lo, hi);
        narrow(lo, hi, low + kk * 16);
        widen<1>(bytes, bias1, lo, hi);
        narrow(lo, hi, high + kk * 16);
      }
    }
  }
}

}  // namespace ellm::avx2
