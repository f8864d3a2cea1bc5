// Vector element-wise kernels against their scalar twins, on every tier the CPU has.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>

#include "test_util.h"

namespace ellm {
namespace {

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rel * std::max(1.0f, std::fabs(want[i]))) << what << " at " << i;
}

const int64_t kCounts[] = {0, 1, 7, 15, 16, 17, 31, 33, 100, 1027};

TEST(Elementwise, ConvertF32ToBf16MatchesScalarBitForBit) {
  for (int64_t n : kCounts) {
    auto x = random_floats(n, 1, -1e3f, 1e3f);
    if (n > 5) {
      x[0] = NAN, x[1] = INFINITY, x[2] = -INFINITY, x[3] = 1e-40f, x[4] = -0.0f;
      x[5] = 3.0e38f;  // rounds up to infinity
    }
    std::vector<bf16> want(n), got(n);
    {
      IsaScope s(Isa::scalar);
      convert_f32_to_bf16(x.data(), want.data(), n);
    }
    for (Isa isa : optimised_isas()) {
      IsaScope s(isa);
      std::fill(got.begin(), got.end(), 0xdead);
      convert_f32_to_bf16(x.data(), got.data(), n);
      EXPECT_EQ(got, want) << isa_name(isa) << " n=" << n;
    }
  }
}

TEST(Elementwise, RoundingIsNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  float halfway;  // 1 + 2^-8: exactly between two bf16 values, rounds to the even one (1.0)
  uint32_t bits = 0x3f808000u;
  __builtin_memcpy(&halfway, &bits, 4);
  EXPECT_EQ(f32_to_bf16(halfway), 0x3f80);
  bits = 0x3f818000u;  // between 0x3f81 and 0x3f82: rounds to even 0x3f82
  __builtin_memcpy(&halfway, &bits, 4);
  EXPECT_EQ(f32_to_bf16(halfway), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(Elementwise, ConvertF32ToF16MatchesScalarBitForBit) {
  for (int64_t n : kCounts) {
    auto x = random_floats(n, 3, -7e4f, 7e4f);  // some beyond 65504, which saturate
    for (int64_t i = 0; i < n; i += 3) x[i] *= 1e-6f;  // the subnormal range starts below 6.1e-5
    if (n > 8) {
      x[0] = NAN, x[1] = INFINITY, x[2] = -INFINITY, x[3] = 1e-40f, x[4] = -0.0f;
      x[5] = 65519.0f, x[6] = -65520.0f, x[7] = 3.0e38f, x[8] = 0x1p-25f;  // 2^-25: ties to 0
    }
    std::vector<f16> want(n), got(n);
    {
      IsaScope s(Isa::scalar);
      convert_f32_to_f16(x.data(), want.data(), n);
    }
    for (Isa isa : optimised_isas()) {
      IsaScope s(isa);
      std::fill(got.begin(), got.end(), 0xdead);
      convert_f32_to_f16(x.data(), got.data(), n);
      EXPECT_EQ(got, want) << isa_name(isa) << " n=" << n;
    }
  }
}

TEST(Elementwise, F16RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);  // halfway to 0x3c01: to even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  // halfway between 0x3c01 and 0x3c02
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7bff);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xfbff);
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);  // 1.5 x 2^-24: to even
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);  // the smallest normal
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  // Every finite FP16 value round-trips exactly through FP32.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // infinity, NaN
    ASSERT_EQ(f32_to_f16(f16_to_f32(f16(h))), h) << std::hex << h;
  }
  EXPECT_EQ(f16_to_f32(0x7c00), INFINITY);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
}

TEST(Elementwise, ConvertBf16ToF32IsExact) {
  for (int64_t n : kCounts) {
    auto x = random_bf16(n, 2, -50, 50);
    for (Isa isa : supported_isas()) {
      IsaScope s(isa);
      std::vector<float> got(n);
      convert_bf16_to_f32(x.data(), got.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], bf16_to_f32(x[i])) << isa_name(isa);
    }
  }
}

// The n-gram table's E4M3 rows: every code (NaN ones included) times a scale, at every length
// and offset, gives the scalar twin's bits on every tier.
TEST(Elementwise, ConvertFp8ToF32GivesTheScalarBitsOnEveryTier) {
  std::vector<uint8_t> codes(1027 + 3);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(i * 37 + i / 256);
  codes[5] = 0x7f, codes[6] = 0xff, codes[7] = 0x7e, codes[8] = 0x01, codes[9] = 0x80;
  for (float scale : {1.0f, 0.0123f, 7.7e-5f, 3.0e4f})
    for (int64_t n : kCounts)
      for (int64_t offset : {0, 3}) {
        std::vector<float> want(n);
        for (int64_t i = 0; i < n; ++i) want[i] = fp8_e4m3_to_f32(codes[offset + i]) * scale;
        for (Isa isa : supported_isas()) {
          IsaScope s(isa);
          std::vector<float> got(n, 1.0f);
          convert_fp8_e4m3_to_f32(codes.data() + offset, scale, got.data(), n);
          for (int64_t i = 0; i < n; ++i) {
            uint32_t a, b;
            std::memcpy(&a, &got[i], 4);
            std::memcpy(&b, &want[i], 4);
            ASSERT_EQ(a, b) << isa_name(isa) << " code " << int(codes[offset + i]) << " scale " << scale;
          }
        }
      }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
}

TEST(Elementwise, RmsnormMatchesScalar) {
  for (int64_t dim : {1, 5, 16, 33, 128, 1000}) {
    int64_t rows = 3, ldx = dim + 3, ldo = dim + 1;
    auto x = random_floats(rows * ldx, 3, -4, 4);
    auto w = random_floats(dim, 4, 0.5f, 1.5f);
    std::vector<float> want(rows * ldo);
    {
      IsaScope s(Isa::scalar);
      rmsnorm(x.data(), rows, dim, ldx, w.data(), 1e-6f, want.data(), ldo);
    }
    // Check the reference itself on row 0.
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[i]) * x[i];
    EXPECT_NEAR(want[0], x[0] / std::sqrt(ss / dim + 1e-6) * w[0], 1e-5);
    for (Isa isa : optimised_isas()) {
      IsaScope s(isa);
      std::vector<float> got(rows * ldo);
      rmsnorm(x.data(), rows, dim, ldx, w.data(), 1e-6f, got.data(), ldo);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < dim; ++i)
          ASSERT_NEAR(got[r * ldo + i], want[r * ldo + i], 1e-5f * std::fabs(want[r * ldo + i]) + 1e-6f)
              << isa_name(isa) << " dim=" << dim;
      // In place.
      std::vector<float> inplace = x;
      rmsnorm(inplace.data(), rows, dim, ldx, w.data(), 1e-6f, inplace.data(), ldx);
      for (int64_t i = 0; i < dim; ++i)
        ASSERT_NEAR(inplace[ldx + i], want[ldo + i], 1e-5f * std::fabs(want[ldo + i]) + 1e-6f);
    }
  }
}

TEST(Elementwise, NormRopeMatchesScalar) {
  for (int64_t head_dim : {2, 8, 20, 64, 128}) {
    int64_t half = head_dim / 2, heads = 3;
    std::vector<float> inv_freq(half), cos(half), sin(half);
    for (int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(1e6f, -2.0f * i / head_dim);
    auto weight = random_floats(head_dim, 9, 0.5f, 1.5f);
    for (int64_t pos : {0, 1, 37, 40000}) {
      rope_angles(pos, inv_freq.data(), half, 1.0f, cos.data(), sin.data());
      auto x = random_floats(heads * head_dim, 5);
      std::vector<float> normed(x.size());
      {
        IsaScope s(Isa::scalar);
        rmsnorm(x.data(), heads, head_dim, head_dim, weight.data(), 1e-6f, normed.data(), head_dim);
      }
      // Into a strided output (as into the KV cache), and in place.
      const int64_t ldo = head_dim + 5;
      std::vector<float> want(heads * ldo, -7.0f);
      {
        IsaScope s(Isa::scalar);
        norm_rope(x.data(), heads, head_dim, weight.data(), 1e-6f, cos.data(), sin.data(), want.data(), ldo);
      }
      for (int64_t h = 0; h < heads; ++h) {
        const float* n = normed.data() + h * head_dim;
        const float* w = want.data() + h * ldo;
        // Rotation keeps each pair's length; at position 0 it is the identity.
        EXPECT_NEAR(w[0] * w[0] + w[half] * w[half], n[0] * n[0] + n[half] * n[half], 1e-4);
        if (pos == 0)
          for (int64_t i = 0; i < head_dim; ++i) EXPECT_NEAR(w[i], n[i], 1e-6f) << i;
        EXPECT_EQ(w[head_dim], -7.0f) << "wrote past the head";
      }
      for (Isa isa : optimised_isas()) {
        IsaScope s(isa);
        std::vector<float> got(heads * ldo, -7.0f);
        norm_rope(x.data(), heads, head_dim, weight.data(), 1e-6f, cos.data(), sin.data(), got.data(), ldo);
        expect_close(got, want, 1e-5f, std::string("norm_rope ") + isa_name(isa));
        auto inplace = x;
        norm_rope(inplace.data(), heads, head_dim, weight.data(), 1e-6f, cos.data(), sin.data(),
                  inplace.data(), head_dim);
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < head_dim; ++i)
            ASSERT_NEAR(inplace[h * head_dim + i], want[h * ldo + i], 1e-5f) << isa_name(isa);
      }
    }
  }
}

TEST(Elementwise, SiluMulMatchesScalar) {
  for (int64_t n : kCounts) {
    auto g = random_floats(n, 6, -30, 30), u = random_floats(n, 7, -3, 3);
    if (n > 3) g[0] = -100, g[1] = 100, g[2] = 0, g[3] = -88;
    std::vector<float> want(n);
    {
      IsaScope s(Isa::scalar);
      silu_mul(g.data(), u.data(), want.data(), n);
    }
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(want[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-5 * std::max(1.0f, std::fabs(want[i])));
    for (Isa isa : optimised_isas()) {
      IsaScope s(isa);
      std::vector<float> got(n);
      silu_mul(g.data(), u.data(), got.data(), n);
      expect_close(got, want, 2e-6f, std::string("silu_mul ") + isa_name(isa));
    }
  }
}

TEST(Elementwise, SoftmaxExpMatchesScalarAndSumsItsWeights) {
  for (int64_t n : kCounts) {
    if (n == 0) continue;
    const auto x = random_floats(n, 8, -20, 20);
    std::vector<float> want = x;
    float want_sum;
    {
      IsaScope s(Isa::scalar);
      want_sum = softmax_exp(want.data(), n, 0.125f);
    }
    const float top = *std::max_element(x.begin(), x.end());
    double exact_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double e = std::exp((double(x[i]) - top) * 0.125);
      exact_sum += e;
      ASSERT_NEAR(want[i], e, 1e-6 * e + 1e-30);
    }
    ASSERT_NEAR(want_sum, exact_sum, 1e-5 * exact_sum);
    for (Isa isa : optimised_isas()) {
      IsaScope s(isa);
      std::vector<float> got = x;
      const float sum = softmax_exp(got.data(), n, 0.125f);
      expect_close(got, want, 2e-6f, std::string("softmax_exp ") + isa_name(isa));
      EXPECT_NEAR(sum, want_sum, 1e-5 * want_sum) << isa_name(isa) << " n " << n;
    }
  }
}

TEST(Elementwise, GeluTanhMatchesScalar) {
  for (int64_t n : kCounts) {
    auto x = random_floats(n, 9, -12, 12);
    if (n > 3) x[0] = -100, x[1] = 100, x[2] = 0, x[3] = -5;
    std::vector<float> want(n);
    {
      IsaScope s(Isa::scalar);
      gelu_tanh(x.data(), want.data(), n);
    }
    for (int64_t i = 0; i < n; ++i) {
      const double v = x[i];
      ASSERT_NEAR(want[i], 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))),
                  1e-6 * std::max(1.0, std::fabs(v)));
    }
    for (Isa isa : optimised_isas()) {
      IsaScope s(isa);
      std::vector<float> got = x;
      gelu_tanh(got.data(), got.data(), n);  // in place
      expect_close(got, want, 2e-6f, std::string("gelu_tanh ") + isa_name(isa));
    }
  }
}

// The same bits on every tier (a MoE router's choice must not depend on the tier, the batch or
// the rows beside it), and near the exact sum.
TEST(Elementwise, DotRowsF32IsTheSameBitsOnEveryTier) {
  const int64_t rows = 7, m = 70, ldx = 1290;  // m past a chunk of 64; ldx > any dim
  auto x = random_floats(m * ldx, 8, -2, 2);
  // Dims with a tail past the vectors, and multiples of 16 (lanes folded in registers) over
  // several blocks of 128 inputs.
  for (int64_t dim : {0, 1, 7, 15, 16, 17, 31, 33, 100, 256, 1027, 1280}) {
    auto w = random_floats(rows * dim, 9, -2, 2);
    std::vector<float> want(m * rows);
    {
      IsaScope s(Isa::scalar);
      dot_rows_f32(x.data(), m, ldx, w.data(), rows, dim, want.data(), rows);
    }
    for (int64_t t = 0; t < m; t += 13)
      for (int64_t r = 0; r < rows; ++r) {
        double exact = 0, size = 0;
        for (int64_t i = 0; i < dim; ++i) {
          exact += double(x[t * ldx + i]) * w[r * dim + i];
          size += std::fabs(double(x[t * ldx + i]) * w[r * dim + i]);
        }
        ASSERT_NEAR(want[t * rows + r], exact, 1e-6 * std::max(1.0, size)) << "row " << r << " of dim " << dim;
      }
    for (Isa isa : optimised_isas()) {
      IsaScope s(isa);
      // Any number of x rows and w rows at once: the same bits for each.
      for (auto [t0, nt, r0, nr] : {std::array<int64_t, 4>{0, m, 0, rows}, {5, 3, 2, 5}, {69, 1, 6, 1}, {1, 66, 0, 3}}) {
        std::vector<float> got(nt * nr);
        dot_rows_f32(x.data() + t0 * ldx, nt, ldx, w.data() + r0 * dim, nr, dim, got.data(), nr);
        for (int64_t t = 0; t < nt; ++t)
          for (int64_t r = 0; r < nr; ++r)
            ASSERT_EQ(std::memcmp(&got[t * nr + r], &want[(t0 + t) * rows + r0 + r], 4), 0)
                << isa_name(isa) << " dim " << dim << " x row " << t0 + t << " w row " << r0 + r;
      }
    }
  }
}

}  // namespace
}  // namespace ellm
