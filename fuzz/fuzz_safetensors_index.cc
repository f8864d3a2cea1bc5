// Fuzzes the sharded-checkpoint reader: arbitrary bytes as model.safetensors.index.json, in a
// folder that also holds two small valid shards the index may name, must give a clean Error,
// never a crash, a foreign exception or a hang.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "base/error.h"
#include "model/load/safetensors.h"

namespace {

// Shards a.safetensors (tensors "x", "y") and b.safetensors ("z"), written once per process.
std::string make_model_dir() {
  std::string dir = "/tmp/ellm_fuzz_index_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  auto fill = [](size_t, int64_t, int64_t count, uint16_t* out) {
    for (int64_t i = 0; i < count; ++i) out[i] = 0x3f80;  // 1.0 in BF16
  };
  ellm::write_safetensors(dir + "/a.safetensors", {{"x", {2, 3}}, {"y", {4}}}, {0, 1}, fill);
  ellm::write_safetensors(dir + "/b.safetensors", {{"z", {1}}}, {0}, fill);
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = make_model_dir();
  if (FILE* f = std::fopen((dir + "/model.safetensors.index.json").c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
    try {
      ellm::SafetensorsStore store = ellm::SafetensorsStore::open(dir);
      for (const auto& [name, info] : store.tensors()) {
        if (info.data + info.bytes > info.file->data() + info.file->size()) __builtin_trap();
        (void)store.file_for(name);
      }
    } catch (const ellm::Error&) {
    }
  }
  return 0;
}
