// FP8 E4M3 products, bit for bit: each tier whose arithmetic is spelled out here (the scalar twin
// and AVX2) must give exactly the bits of that arithmetic, written independently below, so any
// change to how a tier widens the codes (e.g. a cheaper widening on AVX2) fails on a single bit.
// fp8_test.cc checks every tier against a double-precision product within a tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "test_util.h"

namespace ellm {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// The weight value a tier multiplies by. A NaN code (0x7F, 0xFF; the loader refuses them) is NaN
// on the scalar twin; AVX2 widens it as the code pattern reads, exponent 15 and mantissa 7: +-480.
float tier_value(Isa isa, uint8_t code) {
  if (isa == Isa::avx2 && (code & 0x7f) == 0x7f) return code & 0x80 ? -480.0f : 480.0f;
  return fp8_e4m3_to_f32(code);
}

// y[i][j] as the tier computes it: per block of 128 k a partial dot product from zero, in k
// order, then that partial times the block's factor added to the row's sum. The scalar twin
// rounds every product and sum; AVX2 fuses each into one FMA (its codes widened times 2^-8 and
// the factor times 2^8: the same products exactly).
std::vector<float> tier_reference(Isa isa, const std::vector<bf16>& x, int64_t m, int64_t ldx,
                                  const std::vector<uint8_t>& codes, const std::vector<float>& scales,
                                  int64_t n, int64_t k, const std::vector<float>& start) {
  const int64_t k_blocks = (k + 127) / 128;
  const bool fused = isa == Isa::avx2;
  std::vector<float> y(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float sum = start.empty() ? 0.0f : start[i * n + j];
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        float part = 0;
        for (int64_t kk = kb * 128; kk < std::min(k, kb * 128 + 128); ++kk) {
          const float a = bf16_to_f32(x[i * ldx + kk]), w = tier_value(isa, codes[j * k + kk]);
          if (fused) {
            part = std::fma(a, w, part);
          } else {
            const float product = a * w;
            part = part + product;
          }
        }
        const float factor = scales[(j / 128) * k_blocks + kb];
        if (fused) {
          sum = std::fma(part, factor, sum);
        } else {
          const float scaled = part * factor;
          sum = sum + scaled;
        }
      }
      y[i * n + j] = sum;
    }
  return y;
}

std::vector<Isa> tiers_with_reference() {
  std::vector<Isa> tiers;
  for (Isa isa : supported_isas())
    if (isa == Isa::scalar || isa == Isa::avx2) tiers.push_back(isa);
  return tiers;
}

// Every one of the 256 codes, NaN included, each in its own column over k = 1 and k = 130 (a
// partial of two k blocks), times random inputs and a random factor: decode rows and a batch.
TEST(Fp8Bits, EveryCodeGivesTheTiersBits) {
  const int64_t n = 256;
  for (int64_t k : {1, 130})
    for (int64_t m : {1, 2, 4, 7}) {
      std::mt19937 rng(uint32_t(k * 10 + m));
      std::vector<uint8_t> codes(size_t(n * k));
      for (int64_t j = 0; j < n; ++j)
        for (int64_t kk = 0; kk < k; ++kk)
          codes[j * k + kk] = kk == 0 ? uint8_t(j) : uint8_t(rng() % 0x7f);  // first k: code j
      std::vector<float> scales;
      std::uniform_real_distribution<float> unit(1.0f, 2.0f);
      for (int64_t b = 0; b < 2 * ((k + 127) / 128); ++b) scales.push_back(unit(rng) * 0x1p-9f);
      const std::vector<bf16> x = random_bf16(size_t(m * k), uint32_t(m + k), -4, 4);
      for (Isa isa : tiers_with_reference()) {
        PackedWeights w = pack_fp8_weights(codes.data(), scales.data(), n, k, isa);
        std::vector<float> y(size_t(m * n));
        matmul(x.data(), m, k, w, y.data(), n, false, 0, 1);
        const std::vector<float> want = tier_reference(isa, x, m, k, codes, scales, n, k, {});
        for (int64_t i = 0; i < m * n; ++i)
          ASSERT_EQ(bits_of(y[i]), bits_of(want[i]))
              << isa_name(isa) << " m=" << m << " k=" << k << " code " << i % n << ": " << y[i]
              << " against " << want[i];
      }
    }
}

// Random codes (exponent 0 included, NaN not) and factors spread over many powers of two, sizes
// off the 32-column and 128-k blocks; decode rows (m <= 4, codes widened in registers) and small
// batches (the panel path), with and without accumulating, split among members.
TEST(Fp8Bits, RandomMatricesGiveTheTiersBits) {
  struct Shape {
    int64_t m, n, k;
  };
  for (Shape s : {Shape{1, 96, 384}, Shape{1, 70, 300}, Shape{2, 64, 256}, Shape{3, 100, 200},
                  Shape{4, 160, 129}, Shape{5, 96, 256}, Shape{8, 130, 300}}) {
    std::mt19937 rng(uint32_t(s.m * 7919 + s.n * 31 + s.k));
    std::vector<uint8_t> codes(size_t(s.n * s.k));
    for (auto& code : codes) {
      code = uint8_t(rng());
      if ((code & 0x7f) == 0x7f) code ^= 0x01;
      if (rng() % 8 == 0) code &= 0x87;  // exponent 0: zero and subnormals, often
    }
    std::vector<float> scales;
    std::uniform_real_distribution<float> exponent(-20.0f, 6.0f);
    for (int64_t b = 0; b < ((s.n + 127) / 128) * ((s.k + 127) / 128); ++b)
      scales.push_back(std::exp2(exponent(rng)));
    const int64_t ldx = s.k + 5;
    const std::vector<bf16> x = random_bf16(size_t(s.m * ldx), uint32_t(s.n), -8, 8);
    const std::vector<float> start = random_floats(size_t(s.m * s.n), uint32_t(s.k));
    for (Isa isa : tiers_with_reference()) {
      PackedWeights w = pack_fp8_weights(codes.data(), scales.data(), s.n, s.k, isa);
      for (bool accumulate : {false, true})
        for (int members : {1, 3}) {
          std::vector<float> y = start;
          if (!accumulate) std::fill(y.begin(), y.end(), 0.0f);
          for (int member = 0; member < members; ++member)
            matmul(x.data(), s.m, ldx, w, y.data(), s.n, accumulate, member, members);
          const std::vector<float> want = tier_reference(
              isa, x, s.m, ldx, codes, scales, s.n, s.k, accumulate ? start : std::vector<float>{});
          for (int64_t i = 0; i < s.m * s.n; ++i)
            ASSERT_EQ(bits_of(y[i]), bits_of(want[i]))
                << isa_name(isa) << " m=" << s.m << " n=" << s.n << " k=" << s.k << " at " << i
                << (accumulate ? " (accumulate)" : "") << " members=" << members << ": " << y[i]
                << " against " << want[i];
        }
    }
  }
}

}  // namespace
}  // namespace ellm
