#pragma once
// The element types the KV cache can hold (--kv-cache-dtype) and the layout of one position's row
// of n_kv_heads heads of K (or of V):
//   f16, bf16:  [n_kv_heads][head_dim] two-byte elements;
//   fp8, int8:  [n_kv_heads][head_dim] one-byte codes, then [n_kv_heads] FP32 factors.
// A head's factor is amax / 448 (E4M3) or amax / 127 (int8) of that head's row alone
// (docs/kv_cache_dtype.md): a row's codes depend on nothing else, so a position quantises the
// same in any pass, and decode writes one row at a time. Value = code's value * factor.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace ellm {

enum class KvDtype : uint8_t { f16, bf16, fp8, int8 };  // session files store the value

inline const char* kv_dtype_name(KvDtype d) {
  return d == KvDtype::f16 ? "fp16" : d == KvDtype::bf16 ? "bf16" : d == KvDtype::fp8 ? "fp8" : "int8";
}

// One-byte codes with a factor per row and head.
inline bool kv_has_factors(KvDtype d) { return d == KvDtype::fp8 || d == KvDtype::int8; }

// The dtype as Model::kv_format() names it ("f16" as before the flag existed, so FP16 sessions
// saved then still resume).
inline const char* kv_format_tag(KvDtype d) {
  return d == KvDtype::f16    ? "f16"
         : d == KvDtype::bf16 ? "bf16"
         : d == KvDtype::fp8  ? "fp8-e4m3-rowscale"
                              : "int8-rowscale";
}

inline std::optional<KvDtype> parse_kv_dtype(std::string_view s) {
  if (s == "fp16" || s == "f16") return KvDtype::f16;
  if (s == "bf16") return KvDtype::bf16;
  if (s == "fp8" || s == "fp8_e4m3") return KvDtype::fp8;
  if (s == "int8") return KvDtype::int8;
  return std::nullopt;
}

inline size_t kv_element_bytes(KvDtype d) { return kv_has_factors(d) ? 1 : 2; }

// Elements of the dtype from one position's row to the next (bytes for one-byte codes, factors
// included).
inline int64_t kv_row_elements(KvDtype d, int64_t n_kv_heads, int64_t head_dim) {
  return n_kv_heads * head_dim + (kv_has_factors(d) ? int64_t(sizeof(float)) * n_kv_heads : 0);
}
inline size_t kv_row_bytes(KvDtype d, int64_t n_kv_heads, int64_t head_dim) {
  return size_t(kv_row_elements(d, n_kv_heads, head_dim)) * kv_element_bytes(d);
}

// FP8, int8: the factors of a row's heads (n_kv_heads * head_dim codes precede the factors).
inline const float* kv_row_factors(const void* row, int64_t n_kv_heads, int64_t head_dim) {
  return reinterpret_cast<const float*>(static_cast<const uint8_t*>(row) + n_kv_heads * head_dim);
}

}  // namespace ellm
