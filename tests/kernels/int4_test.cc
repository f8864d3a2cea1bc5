// INT4 weights: the packed layout, and the INT4 matrix products on every tier against a
// double-precision product of the dequantised weights, against the scalar twin (the same bits:
// every product of the path is exact), and across passes (a row's result is the same bits with
// any number of rows beside it, through the decode and the panel paths).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <random>

#include "base/error.h"
#include "base/threads.h"
#include "test_util.h"

namespace ellm {
namespace {

struct Int4Case {
  int64_t m, n, k, group;
  bool shuffled = false;  // inputs in a permuted order (GPTQ act-order)
};

struct Int4Problem {
  Int4Case c;
  int64_t ldx, ldy;
  std::vector<bf16> x;
  std::vector<uint8_t> codes, zeros;  // [n][k], [n][k / group]
  std::vector<float> scales;
  std::vector<int32_t> order;
  std::vector<double> want, magnitude;

  Int4Problem(Int4Case shape, uint32_t seed) : c(shape), ldx(shape.k + 3), ldy(shape.n + 2) {
    x = random_bf16(c.m * ldx, seed);
    std::mt19937 rng(seed + 1);
    const int64_t groups = c.k / c.group;
    codes.resize(c.n * c.k);
    for (auto& q : codes) q = uint8_t(rng() % 16);
    std::uniform_real_distribution<float> factor(0.001f, 0.02f);
    for (int64_t i = 0; i < c.n * groups; ++i) {
      scales.push_back(factor(rng));
      zeros.push_back(uint8_t(rng() % 16));
    }
    if (c.shuffled) {
      order.resize(c.k);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
    }
    want.assign(c.m * c.n, 0);
    magnitude.assign(c.m * c.n, 0);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j)
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const int64_t g = j * groups + kk / c.group;
          const double w = double(scales[g]) * (int(codes[j * c.k + kk]) - int(zeros[g]));
          const int64_t input = c.shuffled ? order[kk] : kk;
          const double p = double(bf16_to_f32(x[i * ldx + input])) * w;
          want[i * c.n + j] += p;
          magnitude[i * c.n + j] += std::fabs(p);
        }
  }

  PackedWeights pack(Isa isa) const {
    PackedWeights w = pack_int4_weights(codes.data(), scales.data(), zeros.data(), c.n, c.k,
                                        c.group, isa);
    if (c.shuffled) {
      w.k_order = make_buffer<int32_t>(size_t(c.k));
      std::copy(order.begin(), order.end(), w.k_order.get());
    }
    return w;
  }

  // The product on `isa`, members one after the other (or on `team`), from `start` in y.
  std::vector<float> run(Isa isa, int n_members, bool accumulate, const std::vector<float>& start,
                         ThreadTeam* team = nullptr, std::atomic<int64_t>* pool = nullptr) const {
    PackedWeights w = pack(isa);
    std::vector<float> y = start;
    if (team)
      team->run([&](int member, int n) {
        matmul(x.data(), c.m, ldx, w, y.data(), ldy, accumulate, member, n, pool);
      });
    else
      for (int member = 0; member < n_members; ++member)
        matmul(x.data(), c.m, ldx, w, y.data(), ldy, accumulate, member, n_members, pool);
    return y;
  }
};

constexpr float kSentinel = 12345.0f, kStart = 0.5f;

std::vector<float> start_values(const Int4Problem& p, bool accumulate) {
  std::vector<float> y(p.c.m * p.ldy, kSentinel);
  for (int64_t i = 0; i < p.c.m; ++i)
    for (int64_t j = 0; j < p.c.n; ++j) y[i * p.ldy + j] = accumulate ? kStart : kSentinel;
  return y;
}

TEST(Int4, CodesPackAndUnpack) {
  PackedWeights w = make_int4_weights(70, 64, 32, Isa::scalar);
  for (int64_t j = 0; j < 70; ++j)
    for (int64_t kk = 0; kk < 64; ++kk) set_int4_code(w, j, kk, uint8_t((j * 7 + kk * 3) % 16));
  for (int64_t j = 0; j < 70; ++j)
    for (int64_t kk = 0; kk < 64; ++kk) ASSERT_EQ(int4_code(w, j, kk), (j * 7 + kk * 3) % 16);
  // Column 3 and 19 of a block share a byte: 3 low, 19 high.
  EXPECT_EQ(w.codes[2 * 16 + 3], uint8_t(((3 * 7 + 2 * 3) % 16) | (((19 * 7 + 2 * 3) % 16) << 4)));
  EXPECT_EQ(w.groups, 2);
  EXPECT_THROW(make_int4_weights(8, 64, 48, Isa::scalar), Error);
}

// Decode-sized and prefill-sized products, group sizes 32 to 128 and one that is no power of
// two, edges of the 32-column blocks inside and at the end, inputs in order and shuffled.
TEST(Int4, MatmulMatchesTheDequantisedProductOnEveryTier) {
  const Int4Case cases[] = {{1, 1, 32, 32},      {1, 33, 128, 64},    {2, 130, 256, 128},
                            {3, 200, 96, 32},    {4, 96, 384, 128},   {5, 70, 160, 32},
                            {9, 64, 128, 128},   {17, 300, 96, 48},   {50, 160, 384, 128},
                            {1, 64, 256, 64, true}, {7, 96, 256, 32, true}};
  for (Int4Case c : cases) {
    Int4Problem p(c, uint32_t(c.m * 1000 + c.n + c.k));
    for (Isa isa : supported_isas())
      for (int members : {1, 3}) {
        const bool accumulate = members == 3;
        std::vector<float> y = p.run(isa, members, accumulate, start_values(p, accumulate));
        for (int64_t i = 0; i < c.m; ++i) {
          for (int64_t j = 0; j < c.n; ++j)
            ASSERT_NEAR(y[i * p.ldy + j], p.want[i * c.n + j] + (accumulate ? kStart : 0),
                        1e-5 * p.magnitude[i * c.n + j] + 1e-6)
                << isa_name(isa) << " m=" << c.m << " n=" << c.n << " k=" << c.k
                << " group=" << c.group << " at " << i << "," << j;
          for (int64_t j = c.n; j < p.ldy; ++j)
            ASSERT_EQ(y[i * p.ldy + j], kSentinel) << "wrote past n, " << isa_name(isa);
        }
      }
  }
}

TEST(Int4, TiersGiveTheScalarTwinsBits) {
  for (Int4Case c : {Int4Case{3, 96, 640, 128}, Int4Case{40, 100, 256, 64, true}}) {
    Int4Problem p(c, 9);
    const std::vector<float> want = p.run(Isa::scalar, 1, false, start_values(p, false));
    for (Isa isa : optimised_isas())
      EXPECT_EQ(p.run(isa, 1, false, start_values(p, false)), want) << isa_name(isa) << " m=" << c.m;
  }
}

TEST(Int4, MembersSharingWorkCoverEveryColumnOnce) {
  ThreadTeam team(3, /*pin=*/false);
  for (Isa isa : supported_isas())
    for (Int4Case c : {Int4Case{2, 1000, 256, 128}, Int4Case{20, 500, 256, 64}}) {
      Int4Problem p(c, 5);
      std::atomic<int64_t> pool{0};
      std::vector<float> y = p.run(isa, 3, true, start_values(p, true), &team, &pool);
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j)
          ASSERT_NEAR(y[i * p.ldy + j], p.want[i * c.n + j] + kStart,
                      1e-5 * p.magnitude[i * c.n + j] + 1e-6)
              << isa_name(isa) << " m=" << c.m << " at " << i << "," << j;
    }
}

// A row's result does not depend on the pass it is in: passes of 1 to 9 rows (decode kernel
// and panels) give the bits of one pass of all rows, on every tier.
TEST(Int4, RowResultDoesNotDependOnThePass) {
  const int64_t M = 37, n = 16 * 9 + 5, k = 192;
  for (bool shuffled : {false, true}) {
    Int4Problem p({M, n, k, 64, shuffled}, 31);
    auto start = random_floats(M * p.ldy, 23);
    ThreadTeam team(2, /*pin=*/false);
    for (Isa isa : supported_isas()) {
      PackedWeights w = p.pack(isa);
      for (bool accumulate : {false, true}) {
        std::vector<float> whole = start;
        matmul(p.x.data(), M, p.ldx, w, whole.data(), p.ldy, accumulate, 0, 1);
        for (int64_t rows = 1; rows <= 9; ++rows) {
          const std::vector<float> parts =
              matmul_in_passes(p.x.data(), M, p.ldx, w, start, p.ldy, accumulate, rows, team);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < n; ++j)
              ASSERT_EQ(whole[i * p.ldy + j], parts[i * p.ldy + j])
                  << isa_name(isa) << ": row " << i << " column " << j << " in passes of "
                  << rows << " rows" << (accumulate ? " (accumulate)" : "")
                  << (shuffled ? " (shuffled inputs)" : "");
        }
      }
    }
  }
}

// Every code against every zero point (16 too: GPTQ v1's stored 15 plus 1) through every tier,
// both paths: x = 1 and factor 1 give y = q - zero exactly.
TEST(Int4, EveryCodeAndZeroThroughEveryTier) {
  const int64_t n = 17 * 16, k = 32;
  std::vector<uint8_t> codes(n * k), zeros(n);
  std::vector<float> scales(n, 1.0f);
  for (int64_t j = 0; j < n; ++j) {
    zeros[j] = uint8_t(j / 16);
    for (int64_t kk = 0; kk < k; ++kk) codes[j * k + kk] = kk == 0 ? uint8_t(j % 16) : 0;
  }
  std::vector<bf16> x(6 * k, 0);
  for (int64_t i = 0; i < 6; ++i) x[i * k] = f32_to_bf16(1.0f);
  for (Isa isa : supported_isas()) {
    PackedWeights w = pack_int4_weights(codes.data(), scales.data(), zeros.data(), n, k, k, isa);
    for (int64_t m : {1, 6}) {
      std::vector<float> y(size_t(m * n));
      matmul(x.data(), m, k, w, y.data(), n, false, 0, 1);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          ASSERT_EQ(y[i * n + j], float(j % 16) - float(j / 16))
              << isa_name(isa) << " m=" << m << " code " << j % 16 << " zero " << j / 16;
    }
  }
}

}  // namespace
}  // namespace ellm
