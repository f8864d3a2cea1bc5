// --activations auto: the tier's rule, the timing on AVX2 without VNNI, and a loaded INT4 model
// taking what the timing chose.
#include <gtest/gtest.h>

#include <cmath>

#include "base/cpu.h"
#include "model/load/int4_activations.h"
#include "model/model.h"
#include "model_test_util.h"

namespace ellm {
namespace {

// Restores the tier and AVX-VNNI as the run had them.
class Int4Activations : public testing::Test {
 protected:
  void SetUp() override { isa_ = active_isa(), vnni_ = avx_vnni_enabled(); }
  void TearDown() override {
    set_active_isa(isa_);
    if (has_avx_vnni()) set_avx_vnni_enabled(vnni_);
  }

 private:
  Isa isa_ = Isa::scalar;
  bool vnni_ = false;
};

TEST(Int4ActivationRule, Int8OnlyWhenFasterForOneRowAndNotMuchSlowerForATile) {
  EXPECT_EQ(faster_int4_activations(1.8, 1.2), ActivationDtype::int8);
  EXPECT_EQ(faster_int4_activations(1.1, 0.95), ActivationDtype::int8);
  EXPECT_EQ(faster_int4_activations(0.97, 2.0), ActivationDtype::bf16);
  EXPECT_EQ(faster_int4_activations(1.8, 0.8), ActivationDtype::bf16);
}

TEST_F(Int4Activations, TiersWithVnniTakeInt8AndTheScalarTierBf16WithoutTiming) {
  set_active_isa(Isa::scalar);
  Int4ActivationChoice scalar = choose_int4_activations();
  EXPECT_EQ(scalar.dtype, ActivationDtype::bf16);
  EXPECT_FALSE(scalar.measured);
  if (best_isa() >= Isa::avx512) {
    set_active_isa(Isa::avx512);
    Int4ActivationChoice avx512 = choose_int4_activations();
    EXPECT_EQ(avx512.dtype, ActivationDtype::int8);
    EXPECT_FALSE(avx512.measured);
  }
  if (has_avx_vnni()) {
    set_active_isa(Isa::avx2);
    set_avx_vnni_enabled(true);
    EXPECT_EQ(choose_int4_activations().dtype, ActivationDtype::int8);
  }
}

// AVX2 without VNNI (AVX-VNNI turned off where the CPU has it): both paths timed, the faster
// chosen by the rule, the same answer for every later model of the process, and a 4-bit model
// loaded with auto runs on it.
TEST_F(Int4Activations, Avx2WithoutVnniTimesBothAndLoadsTheFaster) {
  if (best_isa() < Isa::avx2) GTEST_SKIP() << "no AVX2";
  set_active_isa(Isa::avx2);
  if (has_avx_vnni()) set_avx_vnni_enabled(false);
  const Int4ActivationChoice first = choose_int4_activations();
  std::printf("[int4 activations, AVX2 without VNNI] int8 %.2fx BF16 for one row, %.2fx for a tile: %s\n",
              first.decode_speedup, first.prefill_speedup,
              first.dtype == ActivationDtype::int8 ? "int8" : "bf16");
  EXPECT_TRUE(first.measured);
  EXPECT_TRUE(std::isfinite(first.decode_speedup) && first.decode_speedup > 0);
  EXPECT_TRUE(std::isfinite(first.prefill_speedup) && first.prefill_speedup > 0);
  EXPECT_EQ(first.dtype, faster_int4_activations(first.decode_speedup, first.prefill_speedup));
  const Int4ActivationChoice again = choose_int4_activations();
  EXPECT_EQ(again.decode_speedup, first.decode_speedup);
  EXPECT_EQ(again.dtype, first.dtype);

  ServingLimits limits;
  limits.sequence_length = 64;
  limits.threads = 1;
  auto model = Model::load(test::shared_model("tiny-qwen3-gptq"), limits);
  EXPECT_EQ(model->limits().activations, first.dtype);
}

}  // namespace
}  // namespace ellm
