#include "model/load/fingerprint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "base/hash.h"

namespace ellm {
namespace {

// Hashes bytes [offset, offset + count) of a file (fewer at its end) into h.
uint64_t hash_file_range(std::ifstream& in, uint64_t offset, uint64_t count, uint64_t h,
                         std::vector<char>& buffer) {
  buffer.resize(size_t(count));
  in.clear();
  in.seekg(std::streamoff(offset));
  in.read(buffer.data(), std::streamsize(count));
  return hash_bytes(buffer.data(), size_t(in.gcount()), h);
}

}  // namespace

uint64_t model_fingerprint(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(model_dir, ec)) {
    const fs::path& path = entry.path();
    if (path.filename() == "config.json" || path.extension() == ".safetensors") files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  uint64_t h = 0x656c6c6d2d6d6f64ull;
  std::vector<char> buffer;
  for (const fs::path& path : files) {
    const std::string name = path.filename().string();
    h = hash_bytes(name.data(), name.size(), h);
    std::ifstream in(path, std::ios::binary);
    const uint64_t size = fs::file_size(path, ec);
    if (!in || ec) continue;
    h = hash_bytes(&size, sizeof size, h);
    if (path.extension() != ".safetensors") {
      h = hash_file_range(in, 0, size, h, buffer);
      continue;
    }
    uint64_t header_len = 0;
    in.read(reinterpret_cast<char*>(&header_len), 8);
    header_len = std::min<uint64_t>(header_len, std::min<uint64_t>(size, 100u << 20));
    h = hash_file_range(in, 8, header_len, h, buffer);
    const uint64_t data_begin = 8 + header_len, sample = 64 << 10, samples = 16;
    if (size <= data_begin) continue;
    const uint64_t data = size - data_begin;
    for (uint64_t i = 0; i < samples; ++i)
      h = hash_file_range(in, data_begin + data / samples * i, std::min(sample, data), h, buffer);
  }
  return h;
}

}  // namespace ellm
