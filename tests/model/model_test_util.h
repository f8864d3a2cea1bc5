#pragma once
// Helpers shared by the model tests: scratch folders, small random models, the golden files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "model/config.h"
#include "kernels/kernels.h"
#include "tools/make_model.h"

namespace ellm::test {

// A fresh folder under the test temp dir, removed when the object goes away.
struct ScratchDir {
  std::string path;
  ScratchDir() {
    static std::atomic<int> counter{0};
    path = testing::TempDir() + "/ellm_model_test_" + std::to_string(getpid()) + "_" +
           std::to_string(counter++);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

template <class T>
std::vector<T> read_binary(const std::string& path) {
  std::string bytes = read_text(path);
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// A small dense config with a short vocabulary, so test checkpoints are tiny.
inline ModelConfig small_dense_config() {
  ModelConfig c = preset_config("tiny");
  c.vocab_size = 512;
  c.num_hidden_layers = 2;
  return c;
}

inline ModelConfig small_moe_config() {
  ModelConfig c = preset_config("tiny-moe");
  c.vocab_size = 512;
  c.num_hidden_layers = 3;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.mlp_only_layers = {1};
  return c;
}

// Runs fn and returns the Error message it throws ("" if none).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline std::string shared_dir() {
  const char* env = std::getenv("ELLM_SHARED");
  return env ? env : ELLM_SHARED;
}

}  // namespace ellm::test

namespace ellm::test {

// config.json and a single-file checkpoint holding exactly `specs` (small smooth values).
inline void write_checkpoint(const std::string& dir, const ModelConfig& config,
                             const std::vector<TensorSpec>& specs) {
  std::filesystem::create_directories(dir);
  write_text(dir + "/config.json", model_config_json(config));
  std::vector<size_t> all(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) all[i] = i;
  write_safetensors(dir + "/model.safetensors", specs, all,
                    [](size_t tensor, int64_t first, int64_t count, uint16_t* out) {
                      for (int64_t i = 0; i < count; ++i)
                        out[i] = f32_to_bf16(0.02f * std::sin(float(first + i) * 0.37f + tensor));
                    });
}

}  // namespace ellm::test
