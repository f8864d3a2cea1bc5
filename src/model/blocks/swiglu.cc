#include "model/blocks/swiglu.h"

namespace ellm {

SwiGluWeights load_swiglu(TensorLoader& load, const std::string& p, int64_t H, int64_t F) {
  SwiGluWeights w;
  w.gate_up = load.packed({p + "gate_proj.weight", p + "up_proj.weight"}, {F, F}, H);
  w.down = load.packed({p + "down_proj.weight"}, {H}, F);
  return w;
}

void silu_mul_to_bf16(float* gate_up, int64_t begin, int64_t end, int64_t F, bf16* act) {
  for (int64_t t = begin; t < end; ++t) {
    float* row = gate_up + t * 2 * F;
    silu_mul(row, row + F, row, F);
    convert_f32_to_bf16(row, act + t * F, F);
  }
}

void swiglu(BlockContext& ctx, const SwiGluWeights& w, bf16* xb, int64_t n, int64_t H,
            SwiGluBuffers& buffers, float* y, bool accumulate) {
  const int64_t F = w.down.k;
  ctx.gemm(Op::gate_up, xb, n, H, w.gate_up, buffers.gate_up, 2 * F, false);
  ctx.profiler.time(Op::silu_mul, 0, 0, [&] {
    ctx.rows(n, [&](int64_t begin, int64_t end) { silu_mul_to_bf16(buffers.gate_up, begin, end, F, xb); });
  });
  ctx.gemm(Op::down, xb, n, F, w.down, y, H, accumulate);
}

}  // namespace ellm
