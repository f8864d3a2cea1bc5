// AVX2 INT4 products (int4_tile.h): BF16 inputs, and int8 inputs on plain AVX2, whose int8 dot
// product is vpmaddubsw (unsigned codes times int8 inputs, pairs summed to int16: at most
// 2 x 15 x 127, no saturation) and vpmaddwd by 1 (pairs of those to int32). With AVX-VNNI the
// int8 products run in int4_vnni.cc instead (one vpdpbusd, the same sums).
#include "kernels/avx2/avx2.h"
#include "kernels/avx2/int4_tile.h"

namespace ellm::avx2 {
namespace {

struct MaddubsDot {
  static __m256i add(__m256i sum, __m256i codes, __m256i x4) {
    const __m256i pairs = _mm256_maddubs_epi16(codes, x4);
    return _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
};

}  // namespace

void matmul_int4(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
                 int64_t ldy, bool accumulate, int member, int n_members,
                 std::atomic<int64_t>* pool) {
  if (w.int8_inputs && avx_vnni_enabled())
    return matmul_int4_vnni(x, m, ldx, w, y, ldy, accumulate, member, n_members, pool);
  simd::matmul_int4<Tier<MaddubsDot>>(x, m, ldx, w, y, ldy, accumulate, member, n_members, pool);
}

}  // namespace ellm::avx2
