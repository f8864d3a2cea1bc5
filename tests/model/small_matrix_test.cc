// SmallMatrix: a matrix kept in its checkpoint's dtype (BF16, or FP8 codes with 128 x 128 block
// factors) gives, through BlockContext::dot_rows, the bits of dot_rows_f32 over the matrix the
// loader would have widened to FP32: for a decode step (each member's rows widened a tile at a
// time) and a long pass (the matrix widened once), with one member or two, on every tier.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "base/cpu.h"
#include "model/blocks/context.h"
#include "tiers_under_test.h"

namespace ellm {
namespace {

struct Case {
  SmallMatrix matrix;
  std::vector<float> widened;  // as TensorLoader::matrix_f32 widens it
};

Case make_case(Dtype dtype, int64_t rows, int64_t dim, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Case c;
  SmallMatrix& m = c.matrix;
  m.rows = rows;
  m.dim = dim;
  m.dtype = dtype;
  const size_t n = size_t(rows * dim);
  c.widened.resize(n);
  if (dtype == Dtype::bf16) {
    m.b16 = make_buffer<bf16>(n);
    for (size_t i = 0; i < n; ++i) {
      m.b16[i] = f32_to_bf16(normal(rng));
      c.widened[i] = bf16_to_f32(m.b16[i]);
    }
  } else {
    const int64_t blocks = (dim + kFp8BlockK - 1) / kFp8BlockK;
    const int64_t row_blocks = (rows + kFp8BlockK - 1) / kFp8BlockK;
    m.codes = make_buffer<uint8_t>(n);
    m.factors = make_buffer<float>(size_t(blocks * row_blocks));
    for (int64_t i = 0; i < blocks * row_blocks; ++i) m.factors[i] = bf16_to_f32(f32_to_bf16(0.001f + std::abs(normal(rng)) * 0.01f));
    std::uniform_int_distribution<int> code(0, 255);
    for (size_t i = 0; i < n; ++i) {
      uint8_t v;
      do v = uint8_t(code(rng)); while ((v & 0x7f) == 0x7f);  // no NaN codes
      m.codes[i] = v;
      const int64_t r = int64_t(i) / dim, col = int64_t(i) % dim;
      c.widened[i] = fp8_e4m3_to_f32(v) * m.factors[(r / kFp8BlockK) * blocks + col / kFp8BlockK];
    }
  }
  return c;
}

TEST(SmallMatrix, ProductsGiveTheBitsOfTheWidenedMatrix) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // A mix's shapes, cut: [lowrank][width] (long rows) and [width][lowrank] (many short rows,
  // more than a tile), with rows and dims that are not multiples of the tiles or factor blocks,
  // and dims that are (no tail: the vector tiers fold their lanes in registers).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{40, 1300}, {700, 72}, {4, 1300}, {37, 1280}, {300, 80}};
  for (Dtype dtype : {Dtype::bf16, Dtype::f8_e4m3})
    for (const auto& shape : shapes) {
      const int64_t rows = shape.first, dim = shape.second;
      const Case c = make_case(dtype, rows, dim, rng);
      EXPECT_EQ(c.matrix.bytes(), dtype == Dtype::bf16 ? size_t(rows * dim) * 2
                                                      : size_t(rows * dim) + size_t((rows + 127) / 128 * ((dim + 127) / 128)) * 4);
      for (int members : {1, 2}) {
        ThreadTeam team(members, /*pin=*/false);
        BlockContext ctx(team);
        ActivationPlan plan;
        plan.build([&](ActivationPlan& p) { plan_small_matrix_scratch(p, ctx.small, size_t(rows * dim), dim, members); });
        for (int64_t n : {int64_t(1), int64_t(3), int64_t(40)}) {  // decode, a speculative group, a long pass
          std::vector<float> x(size_t(n * dim));
          for (float& v : x) v = normal(rng);
          for (Isa isa : test::tiers_under_test()) {
            set_active_isa(isa);
            std::vector<float> want(size_t(n * rows)), got(size_t(n * rows), -1.0f);
            dot_rows_f32(x.data(), n, dim, c.widened.data(), rows, dim, want.data(), rows);
            ctx.dot_rows(x.data(), n, dim, c.matrix, got.data(), rows);
            ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
                << (dtype == Dtype::bf16 ? "bf16 " : "fp8 ") << rows << "x" << dim << ", " << n << " rows, "
                << members << " members, " << isa_name(isa);
          }
        }
      }
    }
  set_active_isa(best_isa());
}

}  // namespace
}  // namespace ellm
