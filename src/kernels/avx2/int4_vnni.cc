// The AVX2 tier's INT4 product with int8 inputs on AVX-VNNI (int4_tile.h): vpdpbusd adds the
// products of 4 unsigned codes and 4 int8 inputs to each int32 lane. Compiled with -mavxvnni
// (CMakeLists.txt); int4.cc calls it only when the CPU has AVX-VNNI (base/cpu.h).
#include "kernels/avx2/avx2.h"
#include "kernels/avx2/int4_tile.h"

namespace ellm::avx2 {
namespace {

struct VnniDot {
  static __m256i add(__m256i sum, __m256i codes, __m256i x4) {
    return _mm256_dpbusd_avx_epi32(sum, codes, x4);
  }
};

}  // namespace

void matmul_int4_vnni(const bf16* x, int64_t m, int64_t ldx, const PackedWeights& w, float* y,
                      int64_t ldy, bool accumulate, int member, int n_members,
                      std::atomic<int64_t>* pool) {
  simd::matmul_int4<Tier<VnniDot>>(x, m, ldx, w, y, ldy, accumulate, member, n_members, pool);
}

}  // namespace ellm::avx2
