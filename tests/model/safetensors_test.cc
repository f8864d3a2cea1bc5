#include "model/load/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "model_test_util.h"

namespace ellm {
namespace {

using test::error_of;

// A safetensors file from a header text and `data_bytes` bytes of data (value i % 251).
void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::string bytes(8, '\0');
  uint64_t len = header.size();
  std::memcpy(bytes.data(), &len, 8);
  bytes += header;
  for (size_t i = 0; i < data_bytes; ++i) bytes += char(i % 251);
  test::write_text(path, bytes);
}

std::vector<TensorSpec> two_tensors() { return {{"a", {3, 4}}, {"b.weight", {5}}}; }

TensorFill counting_fill() {
  return [](size_t tensor, int64_t first, int64_t count, uint16_t* out) {
    for (int64_t i = 0; i < count; ++i) out[i] = uint16_t(tensor * 1000 + first + i);
  };
}

TEST(Safetensors, WritesAndReadsBackSingleFile) {
  test::ScratchDir dir;
  write_safetensors(dir / "model.safetensors", two_tensors(), {0, 1}, counting_fill());
  SafetensorsStore store = SafetensorsStore::open(dir.path);
  ASSERT_EQ(store.tensor_count(), 2u);
  const TensorInfo& a = store.get("a");
  EXPECT_EQ(a.dtype, Dtype::bf16);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(a.bytes, 24u);
  EXPECT_EQ(a.file_offset % 8, 0u);  // data section 8-byte aligned
  const TensorInfo& b = store.get("b.weight");
  for (int i = 0; i < 5; ++i) {
    uint16_t v;
    std::memcpy(&v, b.data + 2 * i, 2);
    EXPECT_EQ(v, 1000 + i);
  }
  store.release(a);  // pages re-read from the file afterwards
  uint16_t v;
  std::memcpy(&v, a.data + 2 * 11, 2);
  EXPECT_EQ(v, 11);
  EXPECT_EQ(error_of([&] { store.get("c"); }), dir / "model.safetensors" + ": missing tensor 'c'");
}

TEST(Safetensors, ReadsShardsThroughTheIndex) {
  test::ScratchDir dir;
  write_safetensors(dir / "s1.safetensors", two_tensors(), {0}, counting_fill());
  write_safetensors(dir / "s2.safetensors", two_tensors(), {1}, counting_fill());
  test::write_text(dir / "model.safetensors.index.json",
                   R"({"metadata": {}, "weight_map": {"a": "s1.safetensors", "b.weight": "s2.safetensors"}})");
  SafetensorsStore store = SafetensorsStore::open(dir.path);
  EXPECT_EQ(store.tensor_count(), 2u);
  EXPECT_EQ(store.get("a").file->path(), dir / "s1.safetensors");
  EXPECT_EQ(store.get("b.weight").file->path(), dir / "s2.safetensors");
}

TEST(Safetensors, RejectsBrokenFilesWithOneLineNamingTheFile) {
  test::ScratchDir dir;
  std::string path = dir / "model.safetensors";
  auto open_error = [&] { return error_of([&] { SafetensorsStore::open(dir.path); }); };

  test::write_text(path, "abc");
  EXPECT_EQ(open_error(), path + ": truncated safetensors file (no header length)");

  write_raw(path, "{}", 0);
  std::string bytes = test::read_text(path);
  uint64_t huge = 1000;
  std::memcpy(bytes.data(), &huge, 8);
  test::write_text(path, bytes);
  EXPECT_EQ(open_error().rfind(path + ": header length 1000 runs past the end of the file", 0), 0u);

  write_raw(path, "{\"a\": {\"dtype\": \"BF16\", ", 64);
  EXPECT_EQ(open_error(), path + ": corrupt safetensors header (not valid JSON)");

  write_raw(path, R"({"a": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}})", 20);
  EXPECT_EQ(open_error().rfind(path + ": tensor 'a': data_offsets [0, 32] lie outside the data", 0), 0u)
      << open_error();

  write_raw(path, R"({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}})", 8);
  EXPECT_EQ(open_error(), path + ": tensor 'a': data_offsets give 8 bytes but dtype F32 and shape "
                                 "[2, 2] need 16");

  write_raw(path, R"({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}})", 8);
  EXPECT_EQ(open_error(), path + ": tensor 'a': unknown dtype 'Q4'");

  write_raw(path, R"({"a": {"dtype": "BF16", "shape": [-2], "data_offsets": [0, 4]}})", 8);
  EXPECT_EQ(open_error(), path + ": tensor 'a': shape must be non-negative integers");

  // A valid file cut short: the last tensor's data is gone.
  write_safetensors(path, two_tensors(), {0, 1}, counting_fill());
  bytes = test::read_text(path);
  test::write_text(path, bytes.substr(0, bytes.size() - 4));
  EXPECT_NE(open_error().find("tensor 'b.weight': data_offsets"), std::string::npos);

  for (const std::string& message : {open_error()}) EXPECT_EQ(message.find('\n'), std::string::npos);
}

TEST(Safetensors, RejectsAnIndexPointingAtAMissingShard) {
  test::ScratchDir dir;
  write_safetensors(dir / "s1.safetensors", two_tensors(), {0}, counting_fill());
  std::string index = dir / "model.safetensors.index.json";
  test::write_text(index, R"({"weight_map": {"a": "s1.safetensors", "b.weight": "s2.safetensors"}})");
  EXPECT_EQ(error_of([&] { SafetensorsStore::open(dir.path); }),
            index + ": shard 's2.safetensors' does not exist");

  test::write_text(index, R"({"weight_map": {"a": "s1.safetensors", "b.weight": "s1.safetensors"}})");
  EXPECT_EQ(error_of([&] { SafetensorsStore::open(dir.path); }),
            dir / "s1.safetensors" +
                ": missing tensor 'b.weight' listed in model.safetensors.index.json");

  test::write_text(index, R"({"weight_map": {"a": "../s1.safetensors"}})");
  EXPECT_NE(error_of([&] { SafetensorsStore::open(dir.path); }).find("invalid file"),
            std::string::npos);
  // A name the file system refuses (too long) is a missing shard, not a foreign exception.
  test::write_text(index, R"({"weight_map": {"a": ")" + std::string(300, 'x') + R"("}})");
  EXPECT_NE(error_of([&] { SafetensorsStore::open(dir.path); }).find("does not exist"),
            std::string::npos);
  test::write_text(index, R"({"weights": {}})");
  EXPECT_EQ(error_of([&] { SafetensorsStore::open(dir.path); }),
            index + ": missing 'weight_map' object");
}

TEST(Safetensors, NoCheckpointIsAClearError) {
  test::ScratchDir dir;
  EXPECT_EQ(error_of([&] { SafetensorsStore::open(dir.path); }),
            dir.path + ": no model.safetensors or model.safetensors.index.json");
}

}  // namespace
}  // namespace ellm
