// FP8 E4M3 weights: the code table, rounding to it, and the FP8 matrix products on every tier
// against a double-precision product of the dequantised weights (code times factor, exactly).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>

#include "base/threads.h"
#include "test_util.h"

namespace ellm {
namespace {

// E4M3FN by its definition, written independently of the bit manipulation in kernels.h.
double e4m3_by_definition(int code) {
  const int sign = code >> 7, exponent = (code >> 3) & 15, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return NAN;
  double magnitude = exponent == 0 ? mantissa / 8.0 * std::pow(2.0, -6)
                                   : (1 + mantissa / 8.0) * std::pow(2.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

TEST(Fp8, AllCodesDecode) {
  for (int code = 0; code < 256; ++code) {
    const float got = fp8_e4m3_to_f32(uint8_t(code));
    const double want = e4m3_by_definition(code);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << code;
      continue;
    }
    EXPECT_EQ(double(got), want) << "code 0x" << std::hex << code;
    EXPECT_EQ(std::signbit(got), code >= 128) << code;
  }
  // Landmarks: NaN only at 0x7F/0xFF, the largest +-448, the smallest subnormal 2^-9, the
  // smallest normal 2^-6, one.
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), 0x1p-6f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x80), 0.0f);
}

TEST(Fp8, RoundsToNearestEvenAndSaturates) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(uint8_t(code))), code) << code;
    // Halfway to the next code up rounds to the even one of the two.
    if ((code & 0x7f) < 0x7e) {
      const float a = fp8_e4m3_to_f32(uint8_t(code)), b = fp8_e4m3_to_f32(uint8_t(code + 1));
      const int even = code % 2 == 0 ? code : code + 1;
      EXPECT_EQ(f32_to_fp8_e4m3((a + b) / 2), even) << code;
      EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter((a + b) / 2, b)), code + 1) << code;
      EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter((a + b) / 2, a)), code) << code;
    }
  }
  EXPECT_EQ(f32_to_fp8_e4m3(460.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(0x1p-11f), 0x00);  // below half the smallest subnormal
  EXPECT_EQ(f32_to_fp8_e4m3(-0.0f), 0x80);
}

struct Fp8Case {
  int64_t m, n, k;
};

// Random codes (no NaN) and factors; y = x . W^T in double from the dequantised weights.
struct Fp8Problem {
  Fp8Case c;
  int64_t ldx, ldy;
  std::vector<bf16> x;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<double> want, magnitude;

  // exponent0: some codes have exponent 0 (zero, subnormals); without, none has.
  explicit Fp8Problem(Fp8Case shape, uint32_t seed, bool exponent0 = true)
      : c(shape), ldx(shape.k + 3), ldy(shape.n + 2) {
    x = random_bf16(c.m * ldx, seed);
    std::mt19937 rng(seed + 1);
    codes.resize(c.n * c.k);
    for (auto& code : codes) {
      code = uint8_t(rng());
      if ((code & 0x7f) == 0x7f) code = 0x3f;
      if (!exponent0 && (code & 0x78) == 0) code |= 0x40;
    }
    const int64_t row_blocks = (c.n + 127) / 128, k_blocks = (c.k + 127) / 128;
    std::uniform_real_distribution<float> factor(0.001f, 0.01f);
    for (int64_t i = 0; i < row_blocks * k_blocks; ++i) scales.push_back(factor(rng));
    want.assign(c.m * c.n, 0);
    magnitude.assign(c.m * c.n, 0);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j)
        for (int64_t kk = 0; kk < c.k; ++kk) {
          double w = double(fp8_e4m3_to_f32(codes[j * c.k + kk])) *
                     scales[(j / 128) * k_blocks + kk / 128];
          double p = double(bf16_to_f32(x[i * ldx + kk])) * w;
          want[i * c.n + j] += p;
          magnitude[i * c.n + j] += std::fabs(p);
        }
  }

  // Runs the product on `isa` and checks every output against want within rel * magnitude.
  void check(Isa isa, int n_members, bool accumulate, ThreadTeam* team, bool pooled,
             double rel) const {
    PackedWeights w = pack_fp8_weights(codes.data(), scales.data(), c.n, c.k, isa);
    const float kSentinel = 12345.0f, kStart = 0.5f;
    std::vector<float> y(c.m * ldy, kSentinel);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) y[i * ldy + j] = accumulate ? kStart : kSentinel;
    std::atomic<int64_t> pool{0};
    std::atomic<int64_t>* shared = pooled ? &pool : nullptr;
    if (team)
      team->run([&](int member, int n) {
        matmul(x.data(), c.m, ldx, w, y.data(), ldy, accumulate, member, n, shared);
      });
    else
      for (int member = 0; member < n_members; ++member)
        matmul(x.data(), c.m, ldx, w, y.data(), ldy, accumulate, member, n_members, shared);
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double expect = want[i * c.n + j] + (accumulate ? kStart : 0);
        ASSERT_NEAR(y[i * ldy + j], expect, rel * magnitude[i * c.n + j] + 1e-6)
            << isa_name(isa) << " m=" << c.m << " n=" << c.n << " k=" << c.k << " at " << i
            << "," << j << " members=" << n_members;
      }
      for (int64_t j = c.n; j < ldy; ++j)
        ASSERT_EQ(y[i * ldy + j], kSentinel) << "wrote past n, " << isa_name(isa);
    }
  }
};

// Decode-sized products (the codes widened in registers) and prefill-sized ones (the codes
// converted a panel at a time): both exact but for the FP32 sums, on every tier.
// Sizes not multiples of 128 (nor of 32) put the edges of the factor blocks and of the packed
// column blocks inside and at the end of the matrix.
TEST(Fp8, MatmulBlockEdgesOnEveryTier) {
  const Fp8Case cases[] = {{1, 1, 1},     {1, 33, 129},  {2, 130, 255}, {3, 200, 300},
                           {4, 96, 128},  {1, 257, 520}, {5, 130, 255}, {9, 64, 129},
                           {17, 300, 77}, {50, 160, 384}};
  for (Fp8Case c : cases)
    for (bool exponent0 : {true, false}) {
      Fp8Problem problem(c, uint32_t(c.m * 1000 + c.n + c.k), exponent0);
      for (Isa isa : supported_isas())
        for (int members : {1, 3}) {
          problem.check(isa, members, /*accumulate=*/members == 3, nullptr, false, 1e-5);
        }
    }
}

TEST(Fp8, MembersSharingWorkCoverEveryColumnOnce) {
  ThreadTeam team(3, /*pin=*/false);
  for (Isa isa : supported_isas()) {
    Fp8Problem decode({2, 1000, 200}, 5, /*exponent0=*/false), prefill({20, 500, 260}, 6);
    decode.check(isa, 3, true, &team, /*pooled=*/true, 1e-5);
    decode.check(isa, 3, true, nullptr, /*pooled=*/true, 1e-5);
    prefill.check(isa, 3, true, &team, /*pooled=*/true, 1e-5);
  }
}

// Every code through every tier's product, both paths: W[j][0] = code j, factor 1, x = 1, so
// y[j] is the code's value exactly (E4M3 values are exact in BF16 too). NaN codes hold 0.
TEST(Fp8, EveryCodeThroughEveryTier) {
  std::vector<uint8_t> codes(256);
  for (int code = 0; code < 256; ++code) codes[code] = (code & 0x7f) == 0x7f ? 0 : uint8_t(code);
  const float scales[2] = {1.0f, 1.0f};
  for (Isa isa : supported_isas()) {
    PackedWeights w = pack_fp8_weights(codes.data(), scales, 256, 1, isa);
    for (int64_t m : {1, 6}) {
      std::vector<bf16> x(size_t(m), f32_to_bf16(1.0f));
      std::vector<float> y(size_t(m) * 256);
      matmul(x.data(), m, 1, w, y.data(), 256, false, 0, 1);
      for (int64_t i = 0; i < m; ++i)
        for (int code = 0; code < 256; ++code)
          ASSERT_EQ(y[i * 256 + code], fp8_e4m3_to_f32(codes[code]))
              << isa_name(isa) << " m=" << m << " code " << code;
    }
  }
}

TEST(Fp8, TiersAgreeWithScalarTwin) {
  Fp8Problem p({3, 96, 640}, 9);
  PackedWeights ref = pack_fp8_weights(p.codes.data(), p.scales.data(), 96, 640, Isa::scalar);
  std::vector<float> want(3 * 96);
  matmul(p.x.data(), 3, p.ldx, ref, want.data(), 96, false, 0, 1);
  for (Isa isa : optimised_isas()) {
    PackedWeights w = pack_fp8_weights(p.codes.data(), p.scales.data(), 96, 640, isa);
    std::vector<float> got(3 * 96);
    matmul(p.x.data(), 3, p.ldx, w, got.data(), 96, false, 0, 1);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << isa_name(isa);
  }
}

}  // namespace
}  // namespace ellm

namespace ellm {
namespace {

// As for BF16 (matmul_test.cc): a row's result must not depend on the pass it is in, so that
// one-shot prefill equals chunked feeding and decode. Every tier computes prefill with its
// decode arithmetic: per 128 k a partial product of the codes' exact values from zero (FP32 FMA
// chains on scalar and AVX2, vdpbf16ps on AVX-512 and AMX), then one FMA by the factor. An odd k
// puts a lone last k in both paths.
TEST(Fp8, RowResultDoesNotDependOnThePass) {
  const int64_t M = 37, n = 16 * 9 + 5, k = 301;
  Fp8Problem problem({M, n, k}, 31, /*exponent0=*/false);  // the last block: zero columns
  auto start = random_floats(M * problem.ldy, 23);
  ThreadTeam team(2, /*pin=*/false);
  for (Isa isa : supported_isas()) {
    PackedWeights w = pack_fp8_weights(problem.codes.data(), problem.scales.data(), n, k, isa);
    for (bool accumulate : {false, true}) {
      std::vector<float> whole = start;
      matmul(problem.x.data(), M, problem.ldx, w, whole.data(), problem.ldy, accumulate, 0, 1);
      for (int64_t rows = 1; rows <= 9; ++rows) {
        const std::vector<float> parts = matmul_in_passes(problem.x.data(), M, problem.ldx, w,
                                                          start, problem.ldy, accumulate, rows, team);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < n; ++j)
            ASSERT_EQ(whole[i * problem.ldy + j], parts[i * problem.ldy + j])
                << isa_name(isa) << ": row " << i << " column " << j << " in passes of " << rows
                << " rows" << (accumulate ? " (accumulate)" : "");
      }
    }
  }
}

}  // namespace
}  // namespace ellm
