// --kv-cache-dtype and --attention-products (commands.h).
#include <CLI/CLI.hpp>

#include "base/error.h"
#include "cli/commands.h"

namespace ellm {

void add_kv_cache_dtype_option(CLI::App& app) {
  app.add_option("--kv-cache-dtype", "KV cache element type: fp16 (default), bf16, int8 or fp8 "
                                     "(E4M3); int8 and fp8 keep a factor per position and KV head "
                                     "and take half the memory and bytes read of fp16")
      ->default_str("fp16");
  app.add_option("--attention-products",
                 "attention's QK^T and P.V: fp32 (default), or bf16 (Q, K, P and V rounded to BF16, "
                 "FP32 sums) where the CPU has BF16 dot products (AVX-512-BF16, AMX) and the KV "
                 "cache is fp16: 2-3x faster prefill attention, decode attention slower at long "
                 "contexts; FP32 elsewhere")
      ->default_str("fp32");
}

bool attention_bf16_requested(const CLI::App& app) {
  const CLI::Option* option = app.get_option("--attention-products");
  if (option->count() == 0) return false;
  const std::string value = option->as<std::string>();
  if (value != "fp32" && value != "bf16")
    throw Error("--attention-products: '" + value + "' is not fp32 or bf16");
  return value == "bf16";
}

KvDtype kv_cache_dtype_requested(const CLI::App& app) {
  const CLI::Option* option = app.get_option("--kv-cache-dtype");
  if (option->count() == 0) return KvDtype::f16;
  const std::string value = option->as<std::string>();
  const std::optional<KvDtype> dtype = parse_kv_dtype(value);
  if (!dtype) throw Error("--kv-cache-dtype: '" + value + "' is not fp16, bf16, int8 or fp8");
  return *dtype;
}

}  // namespace ellm
