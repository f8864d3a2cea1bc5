#pragma once
// Helpers shared by the model tests: scratch folders, small random models, the golden files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "test_helpers.h"
#include "model/config.h"
#include "tools/hf_config.h"
#include "model/model.h"
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

// Edits a safetensors file's header in place, keeping its length (the edited header, shorter or
// as long, is padded with spaces): renaming a tensor, changing its shape and data_offsets.
inline void edit_safetensors_header(const std::string& path,
                                    const std::function<void(nlohmann::ordered_json& header)>& edit) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t length = 0;
  f.read(reinterpret_cast<char*>(&length), 8);
  std::string text(length, ' ');
  f.read(text.data(), std::streamsize(length));
  nlohmann::ordered_json header = nlohmann::ordered_json::parse(text);
  edit(header);
  std::string edited = header.dump();
  ASSERT_LE(edited.size(), length) << path;
  edited.resize(length, ' ');
  f.seekp(8);
  f.write(edited.data(), std::streamsize(length));
  ASSERT_TRUE(f.good()) << path;
}

// Overwrites `bytes` of tensor `name`'s data, from its `offset`-th byte on.
inline void overwrite_tensor_bytes(const std::string& path, const std::string& name, size_t offset,
                                   const void* bytes, size_t count) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t length = 0;
  f.read(reinterpret_cast<char*>(&length), 8);
  std::string text(length, ' ');
  f.read(text.data(), std::streamsize(length));
  const uint64_t begin = nlohmann::json::parse(text).at(name).at("data_offsets")[0];
  f.seekp(std::streamoff(8 + length + begin + offset));
  f.write(static_cast<const char*>(bytes), std::streamsize(count));
  ASSERT_TRUE(f.good()) << path;
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


// The folder of one of the shared models (shared/models/NAME).
inline std::string shared_model(const std::string& name) { return shared_dir() + "/models/" + name; }

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

// Logits of ids fed as one prefill into slot 0 from position 0, every position wanting them.
inline std::vector<float> run_tokens(Model& model, const std::vector<int32_t>& ids) {
  std::vector<BatchToken> batch;
  for (size_t i = 0; i < ids.size(); ++i) batch.push_back({ids[i], 0, int32_t(i), true});
  std::vector<float> logits(ids.size() * size_t(model.vocab_size()));
  model.forward(batch, logits.data());
  return logits;
}

// Gives slot `to` the KV rows below `end` of slot `from` and a snapshot of the recurrent state
// at `end` (hybrid models), then lets it continue at `end`.
inline void resume_from_copy(Model& model, int from, int to, int64_t end, const std::vector<uint8_t>& snapshot) {
  std::vector<std::span<uint8_t>> src, dst, state;
  model.kv_ranges(from, 0, end, false, src);
  model.kv_ranges(to, 0, end, true, dst);
  for (size_t r = 0; r < dst.size(); ++r) std::memcpy(dst[r].data(), src[r].data(), dst[r].size());
  model.state_ranges(to, true, state);
  size_t offset = 0;
  for (std::span<uint8_t> range : state) {
    std::memcpy(range.data(), snapshot.data() + offset, range.size());
    offset += range.size();
  }
  model.set_state_end(to, end);
}

// Quantised logits `got` against `ref` ([positions][vocab] each): mean KL(ref || got), top-1
// agreement where ref's top-1 margin exceeds margin_min, and the largest |logit difference|.
struct Fidelity {
  double mean_kl = 0, largest = 0;
  int clear = 0, agree = 0;
  double top1() const { return clear ? double(agree) / clear : 1.0; }
  std::string summary(double margin_min) const {
    char line[200];
    std::snprintf(line, sizeof line, "mean KL %.3g, top-1 agreement %d/%d = %.1f%% (margin > %.2f), "
                  "largest |dlogit| %.3f", mean_kl, agree, clear, 100 * top1(), margin_min, largest);
    return line;
  }
};

inline Fidelity fidelity(const std::vector<float>& ref, const std::vector<float>& got, int64_t V,
                         double margin_min) {
  Fidelity f;
  const int64_t positions = int64_t(ref.size()) / V;
  for (int64_t p = 0; p < positions; ++p) {
    const float* r = ref.data() + p * V;
    const float* g = got.data() + p * V;
    double r_max = -INFINITY, g_max = -INFINITY, r_sum = 0, g_sum = 0;
    int64_t r_top = 0, g_top = 0;
    for (int64_t v = 0; v < V; ++v) {
      if (r[v] > r_max) r_max = r[v], r_top = v;
      if (g[v] > g_max) g_max = g[v], g_top = v;
      f.largest = std::max(f.largest, double(std::fabs(r[v] - g[v])));
    }
    double second = -INFINITY;
    for (int64_t v = 0; v < V; ++v)
      if (v != r_top) second = std::max(second, double(r[v]));
    for (int64_t v = 0; v < V; ++v) {
      r_sum += std::exp(r[v] - r_max);
      g_sum += std::exp(g[v] - g_max);
    }
    const double r_lse = r_max + std::log(r_sum), g_lse = g_max + std::log(g_sum);
    double kl = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double log_p = r[v] - r_lse, log_q = g[v] - g_lse;
      kl += std::exp(log_p) * (log_p - log_q);
    }
    f.mean_kl += kl / double(positions);
    if (r_max - second > margin_min) {
      ++f.clear;
      f.agree += r_top == g_top;
    }
  }
  return f;
}

// The error Model::load gives for the folder `dir`: one line.
inline std::string load_error(const std::string& dir, const ServingLimits& limits) {
  std::string message = error_of([&] { Model::load(dir, limits); });
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  return message;
}

}  // namespace ellm::test
