#pragma once
// The attention kernels' view of a KV dtype (kv_dtype.h) over vector traits V: the element type,
// its widening to FP32 vectors, and the factor that widening leaves out. FP8 codes widen to their
// values times 2^-8 (V::load_fp8, exact), so an FP8 row's factor is applied times 256: the
// products are exactly the scalar twin's (code value) x factor. int8 codes widen exactly.
#include <cstdint>
#include <type_traits>

#include "kernels/kernels.h"

namespace ellm::simd {

template <class V, KvDtype D>
struct KvLoad {
  using E = std::conditional_t<D == KvDtype::fp8 || D == KvDtype::int8, uint8_t, uint16_t>;
  static constexpr bool kFactors = D == KvDtype::fp8 || D == KvDtype::int8;
  static constexpr float kWidenedFactor = D == KvDtype::fp8 ? 256.0f : 1.0f;

  static typename V::F load(const E* p) {
    if constexpr (D == KvDtype::f16) return V::load_f16(p);
    else if constexpr (D == KvDtype::bf16) return V::load_bf16(p, V::kLanes);
    else if constexpr (D == KvDtype::fp8) return V::load_fp8(p);
    else return V::load_i8(p);
  }
  static typename V::F load(const E* p, int64_t n) {  // the first n <= kLanes (masked tiers)
    if constexpr (D == KvDtype::f16) return V::load_f16(p, n);
    else if constexpr (D == KvDtype::bf16) return V::load_bf16(p, n);
    else if constexpr (D == KvDtype::fp8) return V::load_fp8(p, n);
    else return V::load_i8(p, n);
  }
  // FP8, int8: position p's factor (FP8: times 256) from the head's factor at position 0, rows ld bytes apart.
  static float factor(const float* factors, int64_t ld, int64_t p) {
    return *reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(factors) + p * ld) *
           kWidenedFactor;
  }
};

}  // namespace ellm::simd
