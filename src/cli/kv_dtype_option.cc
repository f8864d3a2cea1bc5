// --kv-cache-dtype (commands.h).
#include <CLI/CLI.hpp>

#include "base/error.h"
#include "cli/commands.h"

namespace ellm {

void add_kv_cache_dtype_option(CLI::App& app) {
  app.add_option("--kv-cache-dtype", "KV cache element type: fp16 (default), bf16, int8 or fp8 "
                                     "(E4M3); int8 and fp8 keep a factor per position and KV head "
                                     "and take half the memory and bytes read of fp16")
      ->default_str("fp16");
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
