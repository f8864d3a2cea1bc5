// --kv-cache-dtype (commands.h).
#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace ellm {

void add_kv_cache_dtype_option(CLI::App& app) {
  app.add_option("--kv-cache-dtype", "KV cache element type: fp16 (default), bf16, int8 or fp8 "
                                     "(E4M3); int8 and fp8 keep a factor per position and KV head "
                                     "and take half the memory and bytes read of fp16")
      ->check(CLI::IsMember({"fp16", "bf16", "int8", "fp8"}))
      ->default_str("fp16");
}

KvDtype kv_cache_dtype_requested(const CLI::App& app) {
  const CLI::Option* option = app.get_option("--kv-cache-dtype");
  if (option->count() == 0) return KvDtype::f16;
  return parse_kv_dtype(option->as<std::string>()).value_or(KvDtype::f16);
}

}  // namespace ellm
