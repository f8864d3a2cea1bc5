#pragma once
// Reading tokenizer.json fast: the vocabulary and merges (~300k entries for Qwen) are streamed
// straight into flat lists by a SAX parser; only the small rest of the file becomes a JSON tree.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace ellm {

struct TokenizerJson {
  nlohmann::json doc;  // the whole file except model.vocab and model.merges (null there)
  bool has_vocab = false, has_merges = false;
  std::vector<std::pair<std::string, int64_t>> vocab;         // token as spelled in the file, id
  std::vector<std::pair<std::string, std::string>> merges;    // in rank order
};

// Throws Error naming `path` if the file is missing, not JSON, or vocab/merges are malformed.
TokenizerJson read_tokenizer_json(const std::string& path);

// The whole file as bytes; throws Error naming `path` if it cannot be read.
std::string read_file_bytes(const std::string& path);

}  // namespace ellm
