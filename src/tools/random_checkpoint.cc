#include "tools/random_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/log.h"
#include "model/load/tensor_loader.h"

namespace ellm {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const float kRandomHalfWidth = 0.02f * std::sqrt(3.0f);  // standard deviation 0.02

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

uint64_t tensor_seed(uint64_t seed, const std::string& name) {
  return splitmix64(seed * 0x632be59bd9b4e019ull ^ hash_name(name));
}

bf16 random_element(uint64_t seed, int64_t e, bool norm) {
  float scale = norm ? 0.1f : kRandomHalfWidth;  // half-width of the uniform range
  float center = norm ? 1.0f : 0.0f;
  uint64_t r = splitmix64(seed + uint64_t(e >> 2));
  uint32_t bits16 = uint32_t(r >> (16 * (e & 3))) & 0xffff;
  float u = float(bits16) * (2.0f / 65535.0f) - 1.0f;  // [-1, 1]
  return f32_to_bf16(center + scale * u);  // finite: rounds to nearest even
}

float largest_random_element() { return bf16_to_f32(f32_to_bf16(kRandomHalfWidth)); }

std::vector<float> random_fp8_factors(uint64_t seed, int64_t first, int64_t rows, int64_t cols,
                                      bool bf16_factors) {
  const int64_t k_blocks = (cols + kFp8BlockK - 1) / kFp8BlockK;
  std::vector<float> f(size_t((rows + kFp8BlockK - 1) / kFp8BlockK * k_blocks), 0.0f);
  for (int64_t e = 0; e < rows * cols; ++e) {
    float& largest = f[(e / cols / kFp8BlockK) * k_blocks + e % cols / kFp8BlockK];
    largest = std::max(largest, std::fabs(bf16_to_f32(random_element(seed, first + e, false))));
  }
  for (float& v : f) {
    v = fp8_block_factor(v);
    if (!bf16_factors) continue;
    bf16 b = f32_to_bf16(v);
    if (bf16_to_f32(b) < v) ++b;  // positive: the next BF16 up
    v = bf16_to_f32(b);
  }
  return f;
}

float block_factor(const std::vector<float>& factors, int64_t cols, int64_t e) {
  const int64_t k_blocks = (cols + kFp8BlockK - 1) / kFp8BlockK;
  return factors[size_t((e / cols / kFp8BlockK) * k_blocks + e % cols / kFp8BlockK)];
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) fail(path, "write failed");
}

void write_generation_config(const std::string& out_dir, int32_t endoftext, int32_t im_end) {
  nlohmann::ordered_json gen;
  const bool known = endoftext >= 0 && im_end >= 0;
  if (known) gen["bos_token_id"] = endoftext;
  gen["do_sample"] = true;
  if (known) gen["eos_token_id"] = {im_end, endoftext};
  if (known) gen["pad_token_id"] = endoftext;
  gen["temperature"] = 0.6;
  gen["top_k"] = 20;
  gen["top_p"] = 0.95;
  gen["transformers_version"] = "4.51.0";
  write_text(out_dir + "/generation_config.json", gen.dump(2) + "\n");
}

uint64_t tensor_bytes(const TensorSpec& spec) {
  uint64_t bytes = dtype_size(spec.dtype);
  for (int64_t d : spec.shape) bytes *= uint64_t(d);
  return bytes;
}

void write_checkpoint_files(const std::string& out_dir, const std::vector<TensorSpec>& specs,
                            int shards, const TensorBytesFill& fill,
                            const std::function<bool(size_t tensor)>& hole) {
  if (shards < 1) fail("--shards", "must be at least 1");
  uint64_t total_bytes = 0, written_total = 0;
  std::vector<uint64_t> bytes(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    bytes[i] = tensor_bytes(specs[i]);
    total_bytes += bytes[i];
    if (!hole || !hole(i)) written_total += bytes[i];
  }
  std::vector<std::string> files;
  std::vector<std::vector<size_t>> shard_tensors;
  if (shards == 1) {
    files.push_back("model.safetensors");
    shard_tensors.emplace_back();
    for (size_t i = 0; i < specs.size(); ++i) shard_tensors[0].push_back(i);
  } else {
    // Consecutive tensors, cut where the running size crosses each shard's share; no shard is
    // left empty.
    if (size_t(shards) > specs.size())
      fail("--shards", "more shards than the " + std::to_string(specs.size()) + " tensors");
    uint64_t share = (total_bytes + shards - 1) / shards, running = 0;
    shard_tensors.resize(shards);
    size_t shard = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      size_t shards_left = size_t(shards) - shard - 1, tensors_left = specs.size() - i;
      bool full = running >= share * (shard + 1) || tensors_left == shards_left;
      if (full && shards_left > 0 && !shard_tensors[shard].empty()) ++shard;
      shard_tensors[shard].push_back(i);
      running += bytes[i];
    }
    char name[64];
    for (int s = 0; s < shards; ++s) {
      std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
      files.push_back(name);
    }
  }
  Progress progress("writing weights", size_t(written_total >> 20));
  uint64_t written = 0;
  const TensorBytesFill counted = [&](size_t tensor, int64_t first, int64_t count, uint8_t* out) {
    fill(tensor, first, count, out);
    written += uint64_t(count) * dtype_size(specs[tensor].dtype);
    progress.update(size_t(written >> 20));
  };
  for (size_t s = 0; s < files.size(); ++s)
    write_safetensors_bytes(out_dir + "/" + files[s], specs, shard_tensors[s], counted, hole);
  if (shards > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total_bytes}};
    nlohmann::ordered_json map = nlohmann::ordered_json::object();
    for (size_t s = 0; s < files.size(); ++s)
      for (size_t i : shard_tensors[s]) map[specs[i].name] = files[s];
    index["weight_map"] = map;
    write_text(out_dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  std::string summary = std::to_string(total_bytes >> 20) + " MiB in " + std::to_string(files.size()) + " file(s)";
  if (written_total < total_bytes)
    summary += ", " + std::to_string((total_bytes - written_total) >> 20) + " MiB of them holes (no disk)";
  progress.finish(summary);
}

}  // namespace ellm
