#include "model/load/small_matrix.h"

#include <algorithm>

namespace ellm {

size_t SmallMatrix::bytes() const {
  const size_t n = widened_floats();
  switch (dtype) {
    case Dtype::bf16: return n * sizeof(bf16);
    case Dtype::f8_e4m3: return n + size_t((rows + kFp8BlockK - 1) / kFp8BlockK * ((dim + kFp8BlockK - 1) / kFp8BlockK)) * sizeof(float);
    default: return n * sizeof(float);
  }
}

void widen_rows(const SmallMatrix& w, int64_t r0, int64_t r1, float* out) {
  const int64_t D = w.dim;
  if (w.dtype == Dtype::f32) {
    std::copy(w.f32.get() + r0 * D, w.f32.get() + r1 * D, out);
  } else if (w.dtype == Dtype::bf16) {
    convert_bf16_to_f32(w.b16.get() + r0 * D, out, (r1 - r0) * D);
  } else {
    const int64_t blocks = (D + kFp8BlockK - 1) / kFp8BlockK;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < D; c += kFp8BlockK)
        convert_fp8_e4m3_to_f32(w.codes.get() + r * D + c, w.factors[(r / kFp8BlockK) * blocks + c / kFp8BlockK],
                                out + (r - r0) * D + c, std::min(kFp8BlockK, D - c));
  }
}

}  // namespace ellm
