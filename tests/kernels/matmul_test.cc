// Matrix products on every tier against a double-precision reference computed from the same BF16
// inputs; odd shapes hit every tail of the packed layouts and tiles.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>

#include "base/error.h"
#include "base/threads.h"
#include "test_util.h"

namespace ellm {
namespace {

struct Case {
  int64_t m, n, k;
};

// y_ref[i][j] = sum_k x[i][k] * w[j][k] in double, plus the sum of |products| for the tolerance.
void reference(const std::vector<bf16>& x, int64_t ldx, const std::vector<bf16>& w, Case c,
               std::vector<double>& y, std::vector<double>& magnitude) {
  y.assign(c.m * c.n, 0);
  magnitude.assign(c.m * c.n, 0);
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j)
      for (int64_t kk = 0; kk < c.k; ++kk) {
        double p = double(bf16_to_f32(x[i * ldx + kk])) * bf16_to_f32(w[j * c.k + kk]);
        y[i * c.n + j] += p;
        magnitude[i * c.n + j] += std::fabs(p);
      }
}

// With `pooled`, the members share out work as they go (matmul's pool): still every output once.
void check(Isa isa, Case c, int n_members, bool accumulate, ThreadTeam* team, bool pooled = false) {
  int64_t ldx = c.k + 5, ldy = c.n + 3;
  auto x = random_bf16(c.m * ldx, uint32_t(c.m * 31 + c.k));
  auto w = random_bf16(c.n * c.k, uint32_t(c.n * 17 + c.k), -2, 2);
  std::vector<double> want, magnitude;
  reference(x, ldx, w, c, want, magnitude);
  PackedWeights packed = pack_weights(w.data(), c.n, c.k, isa);
  ASSERT_GE(packed.bytes, size_t(c.n * c.k * 2));

  const float kSentinel = 12345.0f, kStart = 0.5f;
  std::vector<float> y(c.m * ldy, kSentinel);
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) y[i * ldy + j] = accumulate ? kStart : kSentinel;
  std::atomic<int64_t> pool{0};
  std::atomic<int64_t>* shared = pooled ? &pool : nullptr;
  if (team)
    team->run([&](int member, int n) {
      matmul(x.data(), c.m, ldx, packed, y.data(), ldy, accumulate, member, n, shared);
    });
  else
    for (int member = 0; member < n_members; ++member)
      matmul(x.data(), c.m, ldx, packed, y.data(), ldy, accumulate, member, n_members, shared);

  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double expect = want[i * c.n + j] + (accumulate ? kStart : 0);
      double tol = 1e-6 * magnitude[i * c.n + j] + 1e-6;
      ASSERT_NEAR(y[i * ldy + j], expect, tol)
          << isa_name(isa) << " m=" << c.m << " n=" << c.n << " k=" << c.k << " at " << i << ","
          << j << " members=" << n_members;
    }
    for (int64_t j = c.n; j < ldy; ++j)
      ASSERT_EQ(y[i * ldy + j], kSentinel) << "wrote past n, " << isa_name(isa);
  }
}

TEST(Matmul, SmallAndOddShapesOnEveryTier) {
  const Case cases[] = {{1, 1, 1},    {1, 16, 2},   {1, 17, 3},   {2, 33, 31},  {3, 32, 64},
                        {4, 100, 65}, {5, 31, 129}, {7, 64, 130}, {8, 48, 257}, {1, 1000, 64},
                        {13, 70, 33}, {12, 64, 96}, {25, 97, 45}, {31, 130, 7}};
  for (Isa isa : supported_isas())
    for (Case c : cases)
      for (int members : {1, 3}) check(isa, c, members, /*accumulate=*/members == 3, nullptr);
}

TEST(Matmul, LargeShapesCrossCacheBlocks) {
  // m above a row tile block and k above a k block, both with tails.
  for (Isa isa : supported_isas()) {
    check(isa, {200, 70, 1031}, 2, false, nullptr);
    check(isa, {2, 300, 2053}, 4, true, nullptr);
    // Decode rows with k over a decode chunk (12288 / rows on AVX2), with a tail, both ways.
    check(isa, {1, 37, 24621}, 2, true, nullptr);
    check(isa, {1, 37, 24621}, 3, false, nullptr);
    check(isa, {5, 40, 5003}, 2, true, nullptr);  // 5 rows: decode chunks of 2456 on AVX2
  }
}

TEST(Matmul, TileMultipleShapesOnEveryTier) {
  // k and n multiples of 32, as every Qwen3 matrix: the AMX tier's own path. Rows cover decode
  // (1-16), one and two row tiles, a tail under and over 16, and a row group with a tail; k
  // covers one step, many, and over an AMX k chunk (4096) with a partial one after it.
  const Case cases[] = {{1, 32, 32},   {4, 64, 1024},  {16, 96, 64},  {17, 32, 96},
                        {32, 64, 512}, {45, 64, 576},  {33, 32, 32},  {200, 96, 608},
                        {7, 128, 544}, {64, 32, 1056}, {40, 64, 4160}};
  for (Isa isa : supported_isas())
    for (Case c : cases)
      for (int members : {1, 3}) check(isa, c, members, /*accumulate=*/members == 3, nullptr);
  ThreadTeam team(2, /*pin=*/false);
  for (Isa isa : supported_isas()) {
    check(isa, {3, 320, 256}, 2, true, &team, /*pooled=*/true);
    check(isa, {100, 160, 512}, 2, false, &team);
  }
}

TEST(Matmul, ThreadTeamCoversAllColumns) {
  ThreadTeam team(3, /*pin=*/false);
  for (Isa isa : supported_isas()) {
    check(isa, {1, 200, 128}, 3, false, &team);
    check(isa, {40, 77, 100}, 3, true, &team);
  }
}

TEST(Matmul, MembersSharingWorkCoverEveryColumnOnce) {
  ThreadTeam team(3, /*pin=*/false);
  for (Isa isa : supported_isas()) {
    // Decode rows (the pool applies), with accumulate so that a column done twice shows; k over
    // an AVX2 decode chunk; then a prefill-sized product, which ignores the pool.
    check(isa, {1, 1000, 64}, 3, true, nullptr, true);
    check(isa, {1, 1000, 64}, 3, true, &team, true);
    check(isa, {3, 333, 130}, 2, true, nullptr, true);
    check(isa, {1, 70, 24621}, 2, true, nullptr, true);
    check(isa, {20, 300, 40}, 3, true, &team, true);
  }
}

TEST(Matmul, TiersAgreeWithScalarTwin) {
  Case c{9, 50, 300};
  auto x = random_bf16(c.m * c.k, 11);
  auto w = random_bf16(c.n * c.k, 12);
  std::vector<float> want(c.m * c.n);
  PackedWeights ref = pack_weights(w.data(), c.n, c.k, Isa::scalar);
  matmul(x.data(), c.m, c.k, ref, want.data(), c.n, false, 0, 1);
  for (Isa isa : optimised_isas()) {
    PackedWeights p = pack_weights(w.data(), c.n, c.k, isa);
    std::vector<float> got(c.m * c.n);
    matmul(x.data(), c.m, c.k, p, got.data(), c.n, false, 0, 1);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4) << isa_name(isa);
  }
}

// A row's result must not depend on the pass it is in: one-shot prefill has to equal feeding the
// same tokens chunk by chunk (and decode), so a product of m rows must give every row the same
// bits as that row alone or in any other block of rows, on every tier. The AVX2 one-row tile
// used to split k over four accumulators, summing in another order than its multi-row tiles.
TEST(Matmul, RowResultDoesNotDependOnThePass) {
  // n: whole blocks on every tier plus a partial one; k over AVX2 decode chunks (2048 at 6
  // rows) and over a prefill chunk, with tails.
  const int64_t M = 53, n = 16 * 9 + 5, k = 2600, ldx = k + 3, ldy = n + 1;
  auto x = random_bf16(M * ldx, 21);
  auto w = random_bf16(n * k, 22, -2, 2);
  auto start = random_floats(M * ldy, 23);
  ThreadTeam team(2, /*pin=*/false);
  for (Isa isa : supported_isas()) {
    PackedWeights packed = pack_weights(w.data(), n, k, isa);
    for (bool accumulate : {false, true}) {
      // All rows in one pass, by one member.
      std::vector<float> whole = start;
      matmul(x.data(), M, ldx, packed, whole.data(), ldy, accumulate, 0, 1);
      // The same rows in passes of every size from 1 to 13 rows (decode and prefill tiles, at
      // every offset in a tile), on two members sharing work as decode does.
      for (int64_t rows = 1; rows <= 13; ++rows) {
        const std::vector<float> parts =
            matmul_in_passes(x.data(), M, ldx, packed, start, ldy, accumulate, rows, team);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < n; ++j)
            ASSERT_EQ(whole[i * ldy + j], parts[i * ldy + j])
                << isa_name(isa) << ": row " << i << " column " << j << " in passes of " << rows
                << " rows" << (accumulate ? " (accumulate)" : "");
      }
    }
  }
}

TEST(Matmul, RejectsEmptyMatrix) {
  bf16 w = 0;
  EXPECT_THROW(pack_weights(&w, 0, 4, Isa::scalar), Error);
}

}  // namespace
}  // namespace ellm
