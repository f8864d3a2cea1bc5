// Fuzzes the safetensors header reader and the config.json parser: arbitrary bytes as a
// safetensors file (and as a config) must give a clean Error, never a crash or a hang.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "base/error.h"
#include "model/config.h"
#include "model/load/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/ellm_fuzz_" + std::to_string(getpid()) + ".safetensors";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
    try {
      ellm::SafetensorsStore store = ellm::SafetensorsStore::open_file(path);
      for (const auto& [name, info] : store.tensors()) (void)store.file_for(name);
    } catch (const ellm::Error&) {
    }
  }
  try {
    ellm::parse_model_config(std::string(reinterpret_cast<const char*>(data), size), "config.json");
  } catch (const ellm::Error&) {
  }
  return 0;
}
