#pragma once
// Byte-level BPE tokenizer read from a Hugging Face model folder (tokenizer.json, plus
// tokenizer_config.json for added-token flags), producing exactly the ids Hugging Face does:
// added tokens matched as single ids anywhere in the text (longest first), NFC on the text
// between them, the file's pre-tokenizer regex, then ranked merges over the GPT-2 byte alphabet.
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer/bpe.h"
#include "text/tokenizer/unicode_regex.h"

namespace ellm {

class Tokenizer {
 public:
  static std::shared_ptr<const Tokenizer> load(const std::string& model_dir);  // throws Error naming the file

  // Throws Error on invalid UTF-8. Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;
  // Bytes of all ids, invalid UTF-8 replaced by U+FFFD; throws Error on an unknown id.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  int64_t vocab_size() const { return static_cast<int64_t>(token_bytes_.size()); }  // largest id + 1
  // `token` as spelled in tokenizer.json (byte-level form, e.g. "Ġworld"), or an added token.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string& token_bytes(int32_t id) const;  // the raw bytes the token decodes to
  bool is_special(int32_t id) const;                 // added token flagged special
  bool is_added(int32_t id) const;

 private:
  struct AddedToken {
    std::string content;
    int32_t id;
  };

  Tokenizer() = default;
  void load_tokenizer_json(const std::string& path);
  void load_tokenizer_config(const std::string& path);
  void set_token(int32_t id, std::string bytes);
  void index_added_tokens();
  // Length of the longest added token starting at text[pos] (0 if none); sets `id`.
  size_t match_added(std::string_view text, size_t pos, int32_t& id) const;
  void encode_segment(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;

  std::vector<std::string> token_bytes_;  // id -> raw bytes
  std::vector<uint8_t> flags_;            // id -> kExists | kAdded | kSpecial
  std::unordered_map<std::string, int32_t> bytes_to_id_;  // vocab tokens (not added ones)
  std::array<int32_t, 256> byte_id_{};                     // single-byte tokens
  BpeMerges merges_;
  std::unique_ptr<UnicodeRegex> split_;
  bool nfc_ = false;
  bool ignore_merges_ = false;
  std::vector<AddedToken> added_;                        // longest content first
  std::array<std::vector<int>, 256> added_by_first_byte_;  // indices into added_
  uint64_t serial_ = 0;                                   // identifies this instance to caches
};

}  // namespace ellm

#include "text/tokenizer/detokenizer.h"
