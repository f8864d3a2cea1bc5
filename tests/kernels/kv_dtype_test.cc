// write_kv_row: each KV dtype's rows round-trip within its precision, zero rows stay zero, huge
// values saturate, nothing becomes NaN or infinity; FP8's per-(position, head) factors against
// one factor for the whole tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "kernels/kv_rows.h"
#include "test_util.h"

namespace ellm {
namespace {

constexpr int64_t kHeads = 4, kHeadDim = 64;

std::vector<uint8_t> write_row(const std::vector<float>& x, KvDtype dtype) {
  std::vector<uint8_t> row(kv_row_bytes(dtype, kHeads, kHeadDim), 0xee);
  write_kv_row(x.data(), kHeads, kHeadDim, dtype, row.data());
  return row;
}

float element(const std::vector<uint8_t>& row, KvDtype dtype, int64_t i) {
  return kv_element(row.data(), dtype, kHeads, kHeadDim, i / kHeadDim, i % kHeadDim);
}

TEST(KvDtype, NamesParseAndRowBytes) {
  for (KvDtype d : {KvDtype::f16, KvDtype::bf16, KvDtype::fp8, KvDtype::int8})
    EXPECT_EQ(parse_kv_dtype(kv_dtype_name(d)), d);
  EXPECT_FALSE(parse_kv_dtype("fp4").has_value());
  EXPECT_EQ(kv_row_bytes(KvDtype::f16, 8, 128), 2048u);
  EXPECT_EQ(kv_row_bytes(KvDtype::bf16, 8, 128), 2048u);
  EXPECT_EQ(kv_row_bytes(KvDtype::fp8, 8, 128), 1024u + 32);
  EXPECT_EQ(kv_row_bytes(KvDtype::int8, 8, 128), 1024u + 32);
}

TEST(KvDtype, RowsRoundTripWithinTheirPrecisionOnEveryTier) {
  std::vector<float> x = random_floats(kHeads * kHeadDim, 7, -3, 3);
  for (int64_t d = 0; d < kHeadDim; ++d) x[2 * kHeadDim + d] *= 100;  // a head of its own scale
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    for (KvDtype dtype : {KvDtype::f16, KvDtype::bf16, KvDtype::fp8, KvDtype::int8}) {
      const std::vector<uint8_t> row = write_row(x, dtype);
      for (int64_t i = 0; i < kHeads * kHeadDim; ++i) {
        const float got = element(row, dtype, i), want = x[i];
        // Relative steps: FP16 2^-11, BF16 2^-8, E4M3 2^-4 (normal codes); FP8 subnormals are
        // steps of amax / 448 * 2^-9 absolute.
        float amax = 0;
        for (int64_t d = 0; d < kHeadDim; ++d) amax = std::max(amax, std::fabs(x[i / kHeadDim * kHeadDim + d]));
        const float tolerance = dtype == KvDtype::f16    ? std::fabs(want) * 0x1p-11f
                                : dtype == KvDtype::bf16 ? std::fabs(want) * 0x1p-8f
                                : dtype == KvDtype::fp8  ? std::fabs(want) * 0x1p-4f + amax / 448 * 0x1p-9f
                                                         : amax / 127 / 2;  // int8: half a step
        ASSERT_LE(std::fabs(got - want), tolerance * 1.0001f)
            << isa_name(isa) << " " << kv_dtype_name(dtype) << " element " << i;
      }
      if (kv_has_factors(dtype))  // each head's largest element is the largest code x factor
        for (int64_t h = 0; h < kHeads; ++h) {
          float amax = 0;
          for (int64_t d = 0; d < kHeadDim; ++d) amax = std::max(amax, std::fabs(x[h * kHeadDim + d]));
          EXPECT_FLOAT_EQ(kv_row_factors(row.data(), kHeads, kHeadDim)[h] * (dtype == KvDtype::fp8 ? 448 : 127), amax);
        }
      // The same bits on every tier.
      static std::vector<uint8_t> first[4];
      if (isa == Isa::scalar) first[int(dtype)] = row;
      EXPECT_EQ(row, first[int(dtype)]) << isa_name(isa) << " " << kv_dtype_name(dtype);
    }
  }
}

TEST(KvDtype, ZeroRowsHugeValuesAndNanStayFinite) {
  std::vector<float> x(kHeads * kHeadDim, 0.0f);  // head 0 all zero
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  for (int64_t d = 0; d < kHeadDim; ++d) {
    x[kHeadDim + d] = d % 2 ? 1e30f : -3e38f;           // head 1: far beyond FP16
    x[2 * kHeadDim + d] = d == 0 ? inf : d == 1 ? -inf : 1.0f;  // head 2: infinities
    x[3 * kHeadDim + d] = d == 5 ? nan : 2.0f;          // head 3: a NaN
  }
  const std::vector<uint8_t> fp8 = write_row(x, KvDtype::fp8), f16 = write_row(x, KvDtype::f16);
  const std::vector<uint8_t> int8 = write_row(x, KvDtype::int8);
  for (int64_t i = 0; i < kHeads * kHeadDim; ++i)
    for (const auto* row : {&fp8, &int8}) {
      const float got = element(*row, row == &fp8 ? KvDtype::fp8 : KvDtype::int8, i);
      ASSERT_TRUE(std::isfinite(got)) << "element " << i;
      ASSERT_LE(std::fabs(got), 65504.0f) << "element " << i;
    }
  for (int64_t d = 0; d < kHeadDim; ++d) EXPECT_EQ(element(int8, KvDtype::int8, d), 0.0f);
  EXPECT_FLOAT_EQ(element(int8, KvDtype::int8, kHeadDim), -65504.0f);
  EXPECT_FLOAT_EQ(element(int8, KvDtype::int8, kHeadDim + 1), 65504.0f);
  EXPECT_EQ(element(int8, KvDtype::int8, 3 * kHeadDim + 5), 0.0f);  // NaN
  EXPECT_EQ(element(int8, KvDtype::int8, 3 * kHeadDim + 4), 2.0f);
  for (int64_t d = 0; d < kHeadDim; ++d) EXPECT_EQ(element(fp8, KvDtype::fp8, d), 0.0f);
  EXPECT_EQ(kv_row_factors(fp8.data(), kHeads, kHeadDim)[0], 0.0f);
  // Saturated as FP16 saturates: +-65504.
  EXPECT_FLOAT_EQ(element(fp8, KvDtype::fp8, kHeadDim), -65504.0f);
  EXPECT_FLOAT_EQ(element(fp8, KvDtype::fp8, kHeadDim + 1), 65504.0f);
  EXPECT_EQ(element(f16, KvDtype::f16, kHeadDim + 1), 65504.0f);
  EXPECT_FLOAT_EQ(element(fp8, KvDtype::fp8, 2 * kHeadDim), 65504.0f);
  EXPECT_EQ(element(fp8, KvDtype::fp8, 3 * kHeadDim + 5), 0.0f);  // NaN: no NaN code in the cache
  EXPECT_EQ(element(fp8, KvDtype::fp8, 3 * kHeadDim + 4), 2.0f);
}

// Keys and values of real models have heads (and positions) of very different magnitude; one
// factor for a whole tensor must cover the largest. E4M3's exponent spans 2^-9 to 448, so a
// spread of a few decades costs the small heads little; beyond that they fall to a few codes or
// subnormals. Prints both errors for spreads of 1, 3, 5 and 7 decades (the design note quotes them)
// and requires the per-row factor to be the better one.
TEST(KvDtype, PerRowFactorsBeatOnePerTensorFactor) {
  const int64_t positions = 256, width = kHeads * kHeadDim;
  for (int decades : {1, 3, 5, 7}) {
    std::vector<float> x = random_floats(positions * width, 11, -1, 1);
    for (int64_t p = 0; p < positions; ++p)
      for (int64_t h = 0; h < kHeads; ++h) {
        // Around 1, so the largest stay inside FP16's range (beyond it both saturate).
        const float magnitude = std::pow(10.0f, float(decades) * (float((p * 7 + h * 3) % 9) / 8 - 0.5f));
        for (int64_t d = 0; d < kHeadDim; ++d) x[p * width + h * kHeadDim + d] *= magnitude;
        x[p * width + h * kHeadDim + 3] *= 8;  // an outlier channel, as RoPE'd keys have
      }
    float tensor_amax = 0;
    for (float v : x) tensor_amax = std::max(tensor_amax, std::fabs(v));
    const float tensor_factor = tensor_amax / 448;
    // Per (position, head): the relative RMS error of its dequantised row; then their mean (a
    // head's attention depends on its own row's relative error, whatever the other heads' scale).
    double row_rel = 0, tensor_rel = 0;
    for (int64_t p = 0; p < positions; ++p) {
      std::vector<float> row_x(x.begin() + p * width, x.begin() + (p + 1) * width);
      const std::vector<uint8_t> row = write_row(row_x, KvDtype::fp8);
      for (int64_t h = 0; h < kHeads; ++h) {
        double row_error = 0, tensor_error = 0, norm = 0;
        for (int64_t i = h * kHeadDim; i < (h + 1) * kHeadDim; ++i) {
          const double per_row = element(row, KvDtype::fp8, i);
          const double per_tensor = double(fp8_e4m3_to_f32(f32_to_fp8_e4m3(row_x[i] / tensor_factor))) * tensor_factor;
          row_error += (per_row - row_x[i]) * (per_row - row_x[i]);
          tensor_error += (per_tensor - row_x[i]) * (per_tensor - row_x[i]);
          norm += double(row_x[i]) * row_x[i];
        }
        row_rel += std::sqrt(row_error / norm) / double(positions * kHeads);
        tensor_rel += std::sqrt(tensor_error / norm) / double(positions * kHeads);
      }
    }
    std::printf("FP8 KV, heads spread over %d decade(s): mean relative RMS error of a head's row %.4f "
                "with a factor per (position, head), %.4f with one per-tensor factor\n",
                decades, row_rel, tensor_rel);
    EXPECT_LT(row_rel, 0.04);  // E4M3's 3 mantissa bits: about 2^-5 relative RMS
    EXPECT_LE(row_rel, tensor_rel);
  }
}

}  // namespace
}  // namespace ellm
