// INT4 weights: the packed layout, and the INT4 matrix products on every tier, with BF16 inputs
// and with inputs quantised to int8 (on AVX2 with and without AVX-VNNI), against a
// double-precision product of the dequantised weights (and the quantised inputs), against the
// scalar twin (the same bits: every step of both paths is exact or rounds the same way), and
// across passes (a row's result is the same bits with any number of rows beside it).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <random>

#include "base/error.h"
#include "base/threads.h"
#include "kernels/simd_int4.h"
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
  std::vector<double> want, magnitude, want_int8;  // want_int8: with the inputs quantised

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
    // The inputs in packed order, as FP32 and quantised to int8 (the reference quantisation).
    const int64_t A = int8_block(c.group);
    std::vector<float> xf(c.k), xq_values(c.k);
    std::vector<int8_t> xq(c.k);
    want.assign(c.m * c.n, 0);
    magnitude.assign(c.m * c.n, 0);
    want_int8.assign(c.m * c.n, 0);
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t kk = 0; kk < c.k; ++kk) xf[kk] = bf16_to_f32(x[i * ldx + (c.shuffled ? order[kk] : kk)]);
      for (int64_t a = 0; a < c.k / A; ++a) {
        float d;
        int32_t sum;
        simd::quantize_int8_block(xf.data() + a * A, A, xq.data() + a * A, &d, &sum);
        for (int64_t kk = a * A; kk < (a + 1) * A; ++kk) xq_values[kk] = float(xq[kk]) * d;
      }
      for (int64_t j = 0; j < c.n; ++j)
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const int64_t g = j * groups + kk / c.group;
          const double w = double(scales[g]) * (int(codes[j * c.k + kk]) - int(zeros[g]));
          const double p = double(xf[kk]) * w;
          want[i * c.n + j] += p;
          magnitude[i * c.n + j] += std::fabs(p);
          want_int8[i * c.n + j] += double(xq_values[kk]) * w;
        }
    }
  }

  PackedWeights pack(Isa isa, bool int8 = false) const {
    PackedWeights w = pack_int4_weights(codes.data(), scales.data(), zeros.data(), c.n, c.k,
                                        c.group, isa);
    w.int8_inputs = int8;
    if (c.shuffled) {
      w.k_order = make_buffer<int32_t>(size_t(c.k));
      std::copy(order.begin(), order.end(), w.k_order.get());
    }
    return w;
  }

  // The product on `isa`, members one after the other (or on `team`), from `start` in y.
  std::vector<float> run(Isa isa, int n_members, bool accumulate, const std::vector<float>& start,
                         bool int8 = false, ThreadTeam* team = nullptr,
                         std::atomic<int64_t>* pool = nullptr) const {
    PackedWeights w = pack(isa, int8);
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

// One way to run an INT4 product: a tier, BF16 or int8 inputs, and for int8 on AVX2 whether
// AVX-VNNI is used (both are tried where the CPU has it).
struct Path {
  Isa isa;
  bool int8;
  bool vnni;
  std::string name() const {
    return std::string(isa_name(isa)) + (int8 ? " int8" : " bf16") +
           (int8 && isa == Isa::avx2 ? (vnni ? " (AVX-VNNI)" : " (no VNNI)") : "");
  }
};

std::vector<Path> every_path(bool with_scalar = true) {
  std::vector<Path> out;
  for (Isa isa : supported_isas()) {
    if (isa == Isa::scalar && !with_scalar) continue;
    out.push_back({isa, false, false});
    out.push_back({isa, true, false});
    if (isa == Isa::avx2 && has_avx_vnni()) out.push_back({isa, true, true});
  }
  return out;
}

// Turns AVX-VNNI on or off for its lifetime (where the CPU has it).
class VnniScope {
 public:
  explicit VnniScope(bool on) : saved_(avx_vnni_enabled()) {
    if (has_avx_vnni()) set_avx_vnni_enabled(on);
  }
  ~VnniScope() {
    if (has_avx_vnni()) set_avx_vnni_enabled(saved_);
  }

 private:
  bool saved_;
};

TEST(Int4, CodesPackAndUnpack) {
  PackedWeights w = make_int4_weights(70, 64, 32, Isa::scalar);
  for (int64_t j = 0; j < 70; ++j)
    for (int64_t kk = 0; kk < 64; ++kk) set_int4_code(w, j, kk, uint8_t((j * 7 + kk * 3) % 16));
  for (int64_t j = 0; j < 70; ++j)
    for (int64_t kk = 0; kk < 64; ++kk) ASSERT_EQ(int4_code(w, j, kk), (j * 7 + kk * 3) % 16);
  // Input 6 of columns 3 and 19 of a block: quad 1, lane 3, byte 2; column 3 low, 19 high.
  EXPECT_EQ(w.codes[64 + 4 * 3 + 2], uint8_t(((3 * 7 + 6 * 3) % 16) | (((19 * 7 + 6 * 3) % 16) << 4)));
  // The second block starts after the first one's 64 inputs x 16 bytes.
  EXPECT_EQ(w.codes[64 * 16 + 1], uint8_t(((32 * 7 + 3) % 16) | (((48 * 7 + 3) % 16) << 4)));
  EXPECT_EQ(w.groups, 2);
  EXPECT_THROW(make_int4_weights(8, 64, 48, Isa::scalar), Error);  // does not divide k
  EXPECT_THROW(make_int4_weights(8, 60, 30, Isa::scalar), Error);  // not whole quads
}

// Int8 blocks: 32 inputs, or the largest divisor of the group below 32 that keeps whole quads.
TEST(Int4, Int8BlocksAndTheirQuantisation) {
  EXPECT_EQ(int8_block(128), 32);
  EXPECT_EQ(int8_block(32), 32);
  EXPECT_EQ(int8_block(48), 24);
  EXPECT_EQ(int8_block(20), 20);
  EXPECT_EQ(int8_block(36), 12);
  // amax 1: x * 127, to nearest even (63.5 -> 64, -63.5 -> -64).
  const float x[8] = {0.5f, -1.0f, 0.25f, 0.0f, 1.0f / 128, -3.0f / 256, -0.5f, 1.0f};
  int8_t q[8];
  float d;
  int32_t sum;
  simd::quantize_int8_block(x, 8, q, &d, &sum);
  EXPECT_EQ(d, 1.0f / 127);
  const int8_t want[8] = {64, -127, 32, 0, 1, -1, -64, 127};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q[i], want[i]) << i;
  EXPECT_EQ(sum, 32);
  const float zeros[4] = {0, 0, -0.0f, 0};
  simd::quantize_int8_block(zeros, 4, q, &d, &sum);
  EXPECT_EQ(d, 0.0f);
  EXPECT_EQ(sum, 0);
}

// Decode-sized and prefill-sized products, group sizes 32 to 128 and some that are no power of
// two (int8 blocks of 24 and 20), edges of the 32-column blocks inside and at the end, inputs in
// order and shuffled; BF16 inputs against the exact product, int8 against the exact product of
// the quantised inputs (and near the BF16 one).
TEST(Int4, MatmulMatchesTheDequantisedProductOnEveryTier) {
  const Int4Case cases[] = {{1, 1, 32, 32},      {1, 33, 128, 64},    {2, 130, 256, 128},
                            {3, 200, 96, 32},    {4, 96, 384, 128},   {5, 70, 160, 32},
                            {9, 64, 128, 128},   {17, 300, 96, 48},   {50, 160, 384, 128},
                            {13, 40, 80, 20},    {1, 64, 256, 64, true}, {7, 96, 256, 32, true}};
  for (Int4Case c : cases) {
    Int4Problem p(c, uint32_t(c.m * 1000 + c.n + c.k));
    for (const Path& path : every_path()) {
      VnniScope vnni(path.vnni);
      const std::vector<double>& want = path.int8 ? p.want_int8 : p.want;
      for (int members : {1, 3}) {
        const bool accumulate = members == 3;
        std::vector<float> y = p.run(path.isa, members, accumulate, start_values(p, accumulate), path.int8);
        for (int64_t i = 0; i < c.m; ++i) {
          for (int64_t j = 0; j < c.n; ++j) {
            const double got = y[i * p.ldy + j] - (accumulate ? kStart : 0);
            ASSERT_NEAR(got, want[i * c.n + j], 1e-5 * p.magnitude[i * c.n + j] + 1e-6)
                << path.name() << " m=" << c.m << " n=" << c.n << " k=" << c.k
                << " group=" << c.group << " at " << i << "," << j;
            if (path.int8)  // int8 inputs: within 1% of the inputs' magnitude times the weights'
              ASSERT_NEAR(got, p.want[i * c.n + j], 0.01 * p.magnitude[i * c.n + j] + 1e-6)
                  << path.name() << " at " << i << "," << j;
          }
          for (int64_t j = c.n; j < p.ldy; ++j)
            ASSERT_EQ(y[i * p.ldy + j], kSentinel) << "wrote past n, " << path.name();
        }
      }
    }
  }
}

TEST(Int4, TiersGiveTheScalarTwinsBits) {
  for (Int4Case c : {Int4Case{3, 96, 640, 128}, Int4Case{1, 96, 640, 128},
                     Int4Case{40, 100, 256, 64, true}, Int4Case{14, 70, 144, 48}}) {
    Int4Problem p(c, 9);
    for (bool int8 : {false, true}) {
      const std::vector<float> want = p.run(Isa::scalar, 1, false, start_values(p, false), int8);
      for (const Path& path : every_path(/*with_scalar=*/false)) {
        if (path.int8 != int8) continue;
        VnniScope vnni(path.vnni);
        EXPECT_EQ(p.run(path.isa, 1, false, start_values(p, false), int8), want)
            << path.name() << " m=" << c.m << " k=" << c.k;
      }
    }
  }
}

TEST(Int4, MembersSharingWorkCoverEveryColumnOnce) {
  ThreadTeam team(3, /*pin=*/false);
  for (const Path& path : every_path())
    for (Int4Case c : {Int4Case{2, 1000, 256, 128}, Int4Case{20, 500, 256, 64}}) {
      VnniScope vnni(path.vnni);
      Int4Problem p(c, 5);
      std::atomic<int64_t> pool{0};
      std::vector<float> y = p.run(path.isa, 3, true, start_values(p, true), path.int8, &team, &pool);
      const std::vector<double>& want = path.int8 ? p.want_int8 : p.want;
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j)
          ASSERT_NEAR(y[i * p.ldy + j], want[i * c.n + j] + kStart,
                      1e-5 * p.magnitude[i * c.n + j] + 1e-6)
              << path.name() << " m=" << c.m << " at " << i << "," << j;
    }
}

// A row's result does not depend on the pass it is in: passes of 1 to 13 rows (decode sizes,
// whole and partial tiles) give the bits of one pass of all rows, on every path.
TEST(Int4, RowResultDoesNotDependOnThePass) {
  const int64_t M = 37, n = 16 * 9 + 5, k = 192;
  ThreadTeam team(2, /*pin=*/false);
  for (bool shuffled : {false, true}) {
    Int4Problem p({M, n, k, 64, shuffled}, 31);
    auto start = random_floats(M * p.ldy, 23);
    for (const Path& path : every_path()) {
      VnniScope vnni(path.vnni);
      PackedWeights w = p.pack(path.isa, path.int8);
      for (bool accumulate : {false, true}) {
        std::vector<float> whole = start;
        matmul(p.x.data(), M, p.ldx, w, whole.data(), p.ldy, accumulate, 0, 1);
        for (int64_t rows : {1, 2, 3, 4, 5, 7, 12, 13}) {
          const std::vector<float> parts =
              matmul_in_passes(p.x.data(), M, p.ldx, w, start, p.ldy, accumulate, rows, team);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < n; ++j)
              ASSERT_EQ(whole[i * p.ldy + j], parts[i * p.ldy + j])
                  << path.name() << ": row " << i << " column " << j << " in passes of "
                  << rows << " rows" << (accumulate ? " (accumulate)" : "")
                  << (shuffled ? " (shuffled inputs)" : "");
        }
      }
    }
  }
}

// Every code against every zero point (16 too: GPTQ v1's stored 15 plus 1) through every path:
// x = 1 (int8: 127 times 1 / 127) and factor 1 give y = q - zero exactly.
TEST(Int4, EveryCodeAndZeroThroughEveryPath) {
  const int64_t n = 17 * 16, k = 32;
  std::vector<uint8_t> codes(n * k), zeros(n);
  std::vector<float> scales(n, 1.0f);
  for (int64_t j = 0; j < n; ++j) {
    zeros[j] = uint8_t(j / 16);
    for (int64_t kk = 0; kk < k; ++kk) codes[j * k + kk] = kk == 0 ? uint8_t(j % 16) : 0;
  }
  std::vector<bf16> x(6 * k, 0);
  for (int64_t i = 0; i < 6; ++i) x[i * k] = f32_to_bf16(1.0f);
  for (const Path& path : every_path()) {
    VnniScope vnni(path.vnni);
    PackedWeights w = pack_int4_weights(codes.data(), scales.data(), zeros.data(), n, k, k, path.isa);
    w.int8_inputs = path.int8;
    for (int64_t m : {1, 6}) {
      std::vector<float> y(size_t(m * n));
      matmul(x.data(), m, k, w, y.data(), n, false, 0, 1);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          ASSERT_NEAR(y[i * n + j], float(j % 16) - float(j / 16), path.int8 ? 1e-5 : 0.0)
              << path.name() << " m=" << m << " code " << j % 16 << " zero " << j / 16;
    }
  }
}

}  // namespace
}  // namespace ellm
