#pragma once
// Safetensors checkpoints, memory-mapped: one model.safetensors or shards listed in
// model.safetensors.index.json. Every header is validated when opened, so a tensor handed out
// always lies inside its file. Also a streaming writer (make-model).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace ellm {

// A read-only private mapping of a whole file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws Error naming the path
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Drops the pages covering [offset, offset+bytes) from this process; they are re-read from the
  // file if touched again.
  void release(size_t offset, size_t bytes) const;

 private:
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

enum class Dtype { bf16, f16, f32, f8_e4m3, other };

struct TensorInfo {
  std::string name;
  std::string dtype_name;  // as in the header: "BF16", "F32", ...
  Dtype dtype = Dtype::other;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapping
  size_t bytes = 0;
  const MappedFile* file = nullptr;
  size_t file_offset = 0;

  int64_t elements() const;
};

size_t dtype_size(const std::string& dtype_name);  // 0 for an unknown name
std::string shape_string(const std::vector<int64_t>& shape);  // "[151936, 1024]"

class SafetensorsStore {
 public:
  // Opens <dir>/model.safetensors.index.json and its shards if present, else
  // <dir>/model.safetensors. Throws Error naming the offending file.
  static SafetensorsStore open(const std::string& model_dir);
  // Opens and validates one file.
  static SafetensorsStore open_file(const std::string& path);

  const TensorInfo* find(const std::string& name) const;
  // Throws "<file>: missing tensor '<name>'".
  const TensorInfo& get(const std::string& name) const;
  // Releases a tensor's pages once its data has been copied out.
  void release(const TensorInfo& t) const;
  // The bytes of the tensors released so far (what a load has read).
  size_t released_bytes() const { return released_bytes_; }
  // The file a tensor of this name would be read from (for messages).
  std::string file_for(const std::string& name) const;
  size_t tensor_count() const { return tensors_.size(); }
  const std::unordered_map<std::string, TensorInfo>& tensors() const { return tensors_; }

 private:
  void add_file(const std::string& path, const std::vector<std::string>* expected);
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::unordered_map<std::string, TensorInfo> tensors_;
  std::unordered_map<std::string, std::string> index_;  // tensor -> shard path (sharded only)
  std::string main_file_;  // the single file or the index
  mutable size_t released_bytes_ = 0;
};

// ---- writing ----

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype = "BF16";  // or F8_E4M3, F32 (write_safetensors_bytes)
};

// Writes a BF16 safetensors file streaming: fill(tensor_index, first_element, count, out)
// produces `count` values of a tensor starting at `first_element`. Memory use is bounded by a
// fixed chunk, whatever the tensor sizes.
using TensorFill = std::function<void(size_t tensor, int64_t first, int64_t count, uint16_t* out)>;
void write_safetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                       const std::vector<size_t>& tensor_ids, const TensorFill& fill);

// The same for tensors of any dtype of dtype_size(): fill writes `count` elements of the
// tensor's own dtype as bytes. A tensor for which `hole` is true is not written at all: the
// file skips its bytes (a hole of a sparse file: zeros that take no disk).
using TensorBytesFill =
    std::function<void(size_t tensor, int64_t first, int64_t count, uint8_t* out)>;
void write_safetensors_bytes(const std::string& path, const std::vector<TensorSpec>& specs,
                             const std::vector<size_t>& tensor_ids, const TensorBytesFill& fill,
                             const std::function<bool(size_t tensor)>& hole = {});

}  // namespace ellm
