#include "model/load/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace ellm {
namespace {

using nlohmann::json;

constexpr size_t kMaxHeaderBytes = 256u << 20;

std::string base_name(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

// The throwing fs::exists() raises filesystem_error for a name the file system refuses (an index
// may name a 300-character shard); such a file simply does not exist here.
bool file_exists(const std::string& path) {
  std::error_code error;
  return std::filesystem::exists(path, error);
}

Dtype parse_dtype(const std::string& name) {
  if (name == "BF16") return Dtype::bf16;
  if (name == "F16") return Dtype::f16;
  if (name == "F32") return Dtype::f32;
  if (name == "F8_E4M3") return Dtype::f8_e4m3;
  return Dtype::other;
}

}  // namespace

// ---- MappedFile ----

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail(path, std::string("cannot map (") + std::strerror(errno) + ")");
    }
    data_ = static_cast<uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) munmap(data_, size_);
}

void MappedFile::release(size_t offset, size_t bytes) const {
  if (!data_ || bytes == 0) return;
  // Rounded outwards: a neighbour sharing an edge page simply faults it back in from the file.
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  size_t begin = offset / page * page;
  size_t end = std::min(size_, (offset + bytes + page - 1) / page * page);
  if (end > begin) madvise(data_ + begin, end - begin, MADV_DONTNEED);
}

// ---- helpers ----

int64_t TensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t dtype_size(const std::string& name) {
  if (name == "BF16" || name == "F16" || name == "I16" || name == "U16") return 2;
  if (name == "F32" || name == "I32" || name == "U32") return 4;
  if (name == "F64" || name == "I64" || name == "U64") return 8;
  if (name == "I8" || name == "U8" || name == "BOOL" || name == "F8_E4M3" || name == "F8_E5M2")
    return 1;
  return 0;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- reading ----

void SafetensorsStore::add_file(const std::string& path,
                                const std::vector<std::string>* expected) {
  auto file = std::make_unique<MappedFile>(path);
  const MappedFile& f = *file;
  if (f.size() < 8) fail(path, "truncated safetensors file (no header length)");
  uint64_t header_len;
  std::memcpy(&header_len, f.data(), 8);
  if (header_len > f.size() - 8)
    fail(path, "header length " + std::to_string(header_len) + " runs past the end of the file (" +
                   std::to_string(f.size()) + " bytes): truncated or corrupt");
  if (header_len > kMaxHeaderBytes) fail(path, "header length implausibly large");
  json header;
  try {
    header = json::parse(f.data() + 8, f.data() + 8 + header_len);
  } catch (const json::exception&) {
    fail(path, "corrupt safetensors header (not valid JSON)");
  }
  if (!header.is_object()) fail(path, "corrupt safetensors header (not a JSON object)");

  size_t data_start = 8 + header_len;
  size_t data_size = f.size() - data_start;
  for (auto& item : header.items()) {
    const std::string& name = item.key();
    const json& entry = item.value();
    if (name == "__metadata__") continue;
    auto bad = [&](const std::string& what) { fail(path, "tensor '" + name + "': " + what); };
    if (!entry.is_object()) bad("header entry is not an object");
    auto dt = entry.find("dtype"), sh = entry.find("shape"), off = entry.find("data_offsets");
    if (dt == entry.end() || !dt->is_string()) bad("missing dtype");
    if (sh == entry.end() || !sh->is_array()) bad("missing shape");
    if (off == entry.end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      bad("missing or invalid data_offsets");
    TensorInfo t;
    t.name = name;
    t.dtype_name = dt->get<std::string>();
    t.dtype = parse_dtype(t.dtype_name);
    size_t elem = dtype_size(t.dtype_name);
    if (elem == 0) bad("unknown dtype '" + t.dtype_name + "'");
    unsigned __int128 count = 1;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned()) bad("shape must be non-negative integers");
      t.shape.push_back(d.get<int64_t>());
      count *= d.get<uint64_t>();
      if (count > (unsigned __int128)(1) << 62) bad("shape too large");
    }
    uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end || end > data_size)
      bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
          "] lie outside the data (" + std::to_string(data_size) + " bytes): truncated or corrupt");
    if ((unsigned __int128)(end - begin) != count * elem)
      bad("data_offsets give " + std::to_string(end - begin) + " bytes but dtype " + t.dtype_name +
          " and shape " + shape_string(t.shape) + " need " + std::to_string(uint64_t(count * elem)));
    t.bytes = end - begin;
    t.file_offset = data_start + begin;
    t.data = f.data() + t.file_offset;
    t.file = &f;
    if (expected) {
      auto it = index_.find(name);
      if (it == index_.end() || it->second != path) continue;  // not the copy the index chose
    }
    if (tensors_.count(name)) bad("appears twice");
    tensors_.emplace(name, std::move(t));
  }
  if (expected)
    for (const std::string& name : *expected)
      if (!tensors_.count(name))
        fail(path, "missing tensor '" + name + "' listed in model.safetensors.index.json");
  files_.push_back(std::move(file));
}

SafetensorsStore SafetensorsStore::open_file(const std::string& path) {
  SafetensorsStore s;
  s.main_file_ = path;
  s.add_file(path, nullptr);
  return s;
}

SafetensorsStore SafetensorsStore::open(const std::string& model_dir) {
  std::string index_path = model_dir + "/model.safetensors.index.json";
  if (!file_exists(index_path)) {
    std::string single = model_dir + "/model.safetensors";
    if (!file_exists(single))
      fail(model_dir, "no model.safetensors or model.safetensors.index.json");
    return open_file(single);
  }
  SafetensorsStore s;
  s.main_file_ = index_path;
  std::ifstream in(index_path);
  if (!in) fail(index_path, "cannot open");
  json index;
  try {
    index = json::parse(in);
  } catch (const json::exception&) {
    fail(index_path, "invalid JSON");
  }
  auto map = index.find("weight_map");
  if (!index.is_object() || map == index.end() || !map->is_object())
    fail(index_path, "missing 'weight_map' object");
  std::vector<std::string> shard_order;
  std::unordered_map<std::string, std::vector<std::string>> by_shard;
  for (auto& [name, shard] : map->items()) {
    if (!shard.is_string()) fail(index_path, "weight_map entry '" + name + "' is not a file name");
    std::string file = shard.get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      fail(index_path, "weight_map entry '" + name + "' names an invalid file '" + file + "'");
    std::string path = model_dir + "/" + file;
    if (!by_shard.count(path)) shard_order.push_back(path);
    by_shard[path].push_back(name);
    s.index_[name] = path;
  }
  for (const std::string& path : shard_order)
    if (!file_exists(path))
      fail(index_path, "shard '" + base_name(path) + "' does not exist");
  for (const std::string& path : shard_order) s.add_file(path, &by_shard[path]);
  return s;
}

const TensorInfo* SafetensorsStore::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::string SafetensorsStore::file_for(const std::string& name) const {
  auto it = index_.find(name);
  return it != index_.end() ? it->second : main_file_;
}

const TensorInfo& SafetensorsStore::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) fail(file_for(name), "missing tensor '" + name + "'");
  return *t;
}

void SafetensorsStore::release(const TensorInfo& t) const {
  t.file->release(t.file_offset, t.bytes);
  released_bytes_ += t.bytes;
}

// ---- writing ----

void write_safetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                       const std::vector<size_t>& tensor_ids, const TensorFill& fill) {
  write_safetensors_bytes(path, specs, tensor_ids,
                          [&](size_t tensor, int64_t first, int64_t count, uint8_t* out) {
                            if (specs[tensor].dtype != "BF16")
                              fail(path, "tensor '" + specs[tensor].name + "' is not BF16");
                            std::vector<uint16_t> values(static_cast<size_t>(count));
                            fill(tensor, first, count, values.data());
                            std::memcpy(out, values.data(), size_t(count) * 2);
                          });
}

void write_safetensors_bytes(const std::string& path, const std::vector<TensorSpec>& specs,
                             const std::vector<size_t>& tensor_ids, const TensorBytesFill& fill,
                             const std::function<bool(size_t tensor)>& hole) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (size_t id : tensor_ids) {
    const TensorSpec& s = specs[id];
    uint64_t bytes = dtype_size(s.dtype);
    if (bytes == 0) fail(path, "tensor '" + s.name + "': unknown dtype '" + s.dtype + "'");
    for (int64_t d : s.shape) bytes *= uint64_t(d);
    header[s.name] = {{"dtype", s.dtype}, {"shape", s.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned, as HF writes it
  uint64_t len = text.size();

  std::FILE* out = std::fopen(path.c_str(), "wb");
  if (!out) fail(path, std::string("cannot create (") + std::strerror(errno) + ")");
  auto write = [&](const void* p, size_t n) {
    if (std::fwrite(p, 1, n, out) != n) {
      std::fclose(out);
      fail(path, "write failed (disk full?)");
    }
  };
  write(&len, 8);
  write(text.data(), text.size());
  constexpr int64_t kChunk = 1 << 22;  // elements
  std::vector<uint8_t> buffer;
  for (size_t id : tensor_ids) {
    const size_t element = dtype_size(specs[id].dtype);
    buffer.resize(size_t(kChunk) * element);
    int64_t total = 1;
    for (int64_t d : specs[id].shape) total *= d;
    if (hole && hole(id)) {
      if (fseeko(out, off_t(uint64_t(total) * element), SEEK_CUR) != 0) {
        std::fclose(out);
        fail(path, std::string("cannot seek past tensor '") + specs[id].name + "' (" + std::strerror(errno) + ")");
      }
      continue;
    }
    for (int64_t first = 0; first < total; first += kChunk) {
      int64_t n = std::min(kChunk, total - first);
      fill(id, first, n, buffer.data());
      write(buffer.data(), size_t(n) * element);
    }
  }
  // A hole at the end is not in the file until its size says so.
  if (std::fflush(out) != 0 || ftruncate(fileno(out), off_t(8 + len + offset)) != 0) {
    std::fclose(out);
    fail(path, std::string("write failed (") + std::strerror(errno) + ")");
  }
  if (std::fclose(out) != 0) fail(path, "write failed (disk full?)");
}

}  // namespace ellm
