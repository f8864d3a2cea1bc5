#include "text/tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/tokenizer/bpe_file.h"
#include "text/tokenizer/unicode.h"

namespace ellm {
namespace {

using nlohmann::json;

constexpr uint8_t kExists = 1, kAdded = 2, kSpecial = 4;
constexpr int64_t kMaxTokenId = 1 << 24;  // guards against absurd ids in a malformed file

// Hugging Face's ByteLevel pre-tokenizer regex, for files that use it instead of a Split.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

json read_json(const std::string& path) {
  json doc = json::parse(read_file_bytes(path), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) fail(path, "not valid JSON");
  if (!doc.is_object()) fail(path, "expected a JSON object at the top level");
  return doc;
}

// The raw bytes of a token spelled in the byte-level alphabet. A token with characters
// outside the alphabet stands for its own UTF-8 bytes, as in Hugging Face's ByteLevel decoder.
std::string byte_level_to_bytes(std::string_view token) {
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    int length = 0;
    int b = unicode::codepoint_to_byte(unicode::decode_utf8(token.substr(i), length));
    if (b < 0) return std::string(token);
    bytes += static_cast<char>(b);
    i += length;
  }
  return bytes;
}

std::string string_field(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) fail(where, std::string("missing string field '") + key + "'");
  return it->get<std::string>();
}

bool bool_field(const json& obj, const char* key, bool fallback) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

int32_t checked_id(const json& value, const std::string& where) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= kMaxTokenId)
    fail(where, "token id must be an integer in [0, " + std::to_string(kMaxTokenId) + ")");
  return static_cast<int32_t>(value.get<int64_t>());
}

// The split regex of the pre-tokenizer; throws for pre-tokenizers this tokenizer cannot honour.
std::string split_pattern(const json& pre, const std::string& where) {
  if (pre.is_null()) return "";
  std::string type = string_field(pre, "type", where + " pre_tokenizer");
  if (type == "Sequence") {
    std::string pattern;
    for (const json& step : pre.value("pretokenizers", json::array())) {
      std::string p = split_pattern(step, where);
      if (!p.empty() && !pattern.empty()) fail(where, "more than one regex pre-tokenizer is not supported");
      if (!p.empty()) pattern = p;
    }
    return pattern;
  }
  if (type == "Split") {
    if (pre.value("behavior", "") != "Isolated" || bool_field(pre, "invert", false))
      fail(where, "only Split pre-tokenizers with behavior Isolated are supported");
    const json& pattern = pre.value("pattern", json::object());
    if (pattern.contains("Regex")) return string_field(pattern, "Regex", where + " pattern");
    if (pattern.contains("String")) return "\\Q" + string_field(pattern, "String", where) + "\\E";
    fail(where, "Split pre-tokenizer without a pattern");
  }
  if (type == "ByteLevel") {
    if (bool_field(pre, "add_prefix_space", false)) fail(where, "ByteLevel add_prefix_space is not supported");
    return bool_field(pre, "use_regex", true) ? kGpt2Pattern : "";
  }
  fail(where, "unsupported pre-tokenizer type '" + type + "'");
}

bool wants_nfc(const json& normalizer, const std::string& where) {
  if (normalizer.is_null()) return false;
  std::string type = string_field(normalizer, "type", where + " normalizer");
  if (type == "NFC") return true;
  if (type == "Sequence") {
    bool nfc = false;
    for (const json& step : normalizer.value("normalizers", json::array())) nfc |= wants_nfc(step, where);
    return nfc;
  }
  fail(where, "unsupported normalizer type '" + type + "'");
}

// Per-thread memo of piece -> ids so repeated words skip the merge loop: direct-mapped like a
// CPU cache (one 64-byte line per word, a collision just overwrites), so it needs no lock, no
// allocation per word and stays small. Tagged with the tokenizer's serial so another
// tokenizer never reads it.
struct WordCache {
  static constexpr size_t kMaxPiece = 30, kMaxIds = 8, kLines = 8192;
  struct Line {
    uint8_t length = 0, count = 0;  // length 0: empty (pieces reaching the cache are >= 2 bytes)
    char bytes[kMaxPiece];
    int32_t ids[kMaxIds];
  };
  uint64_t owner = 0;
  std::vector<Line> lines{kLines};

  Line& line_for(std::string_view piece) { return lines[std::hash<std::string_view>{}(piece) % kLines]; }
};

WordCache& word_cache(uint64_t owner) {
  thread_local std::unique_ptr<WordCache> cache;
  if (!cache) cache = std::make_unique<WordCache>();
  if (cache->owner != owner) {
    cache->lines.assign(WordCache::kLines, {});
    cache->owner = owner;
  }
  return *cache;
}

}  // namespace

std::shared_ptr<const Tokenizer> Tokenizer::load(const std::string& model_dir) {
  static std::atomic<uint64_t> instances{0};
  std::shared_ptr<Tokenizer> t(new Tokenizer);
  t->serial_ = ++instances;
  t->load_tokenizer_json(model_dir + "/tokenizer.json");
  std::string config = model_dir + "/tokenizer_config.json";
  if (std::filesystem::exists(config)) t->load_tokenizer_config(config);
  t->index_added_tokens();
  return t;
}

void Tokenizer::set_token(int32_t id, std::string bytes) {
  if (static_cast<size_t>(id) >= token_bytes_.size()) {
    token_bytes_.resize(id + 1);
    flags_.resize(id + 1, 0);
  }
  token_bytes_[id] = std::move(bytes);
  flags_[id] |= kExists;
}

void Tokenizer::load_tokenizer_json(const std::string& path) {
  TokenizerJson file = read_tokenizer_json(path);
  const json& doc = file.doc;
  try {
    const json& model = doc.value("model", json::object());
    if (model.value("type", "BPE") != "BPE") fail(path, "model.type must be BPE");
    if (!model.value("continuing_subword_prefix", json("")).get<std::string>().empty() ||
        !model.value("end_of_word_suffix", json("")).get<std::string>().empty())
      fail(path, "BPE subword prefixes/suffixes are not supported (only byte-level BPE)");
    ignore_merges_ = bool_field(model, "ignore_merges", false);

    if (!file.has_vocab) fail(path, "missing object model.vocab");
    token_bytes_.reserve(file.vocab.size() + 1024);
    bytes_to_id_.reserve(file.vocab.size());
    for (auto& [token, id] : file.vocab) {
      if (id < 0 || id >= kMaxTokenId)
        fail(path + " model.vocab['" + token + "']", "token id must be in [0, " + std::to_string(kMaxTokenId) + ")");
      std::string bytes = byte_level_to_bytes(token);
      bytes_to_id_.emplace(bytes, static_cast<int32_t>(id));
      set_token(static_cast<int32_t>(id), std::move(bytes));
    }
    for (int b = 0; b < 256; ++b) {
      auto it = bytes_to_id_.find(std::string(1, static_cast<char>(b)));
      if (it == bytes_to_id_.end()) fail(path, "model.vocab lacks the byte-level token for byte " + std::to_string(b));
      byte_id_[b] = it->second;
    }

    if (!file.has_merges) fail(path, "missing array model.merges");
    merges_.reserve(file.merges.size());
    int32_t rank = 0;
    std::string merged;
    for (const auto& [left, right] : file.merges) {
      std::string left_bytes = byte_level_to_bytes(left), right_bytes = byte_level_to_bytes(right);
      merged = left_bytes;
      merged += right_bytes;
      auto l = bytes_to_id_.find(left_bytes), r = bytes_to_id_.find(right_bytes), m = bytes_to_id_.find(merged);
      if (l == bytes_to_id_.end() || r == bytes_to_id_.end() || m == bytes_to_id_.end())
        fail(path, "merge " + std::to_string(rank) + " ('" + left + "' '" + right + "') uses a token not in model.vocab");
      merges_.add(l->second, r->second, m->second, rank++);
    }

    nfc_ = wants_nfc(doc.value("normalizer", json()), path);
    std::string pattern = split_pattern(doc.value("pre_tokenizer", json()), path);
    if (!pattern.empty()) split_ = std::make_unique<UnicodeRegex>(pattern, path);

    for (const json& added : doc.value("added_tokens", json::array())) {
      std::string where = path + " added_tokens";
      int32_t id = checked_id(added.value("id", json()), where);
      std::string content = string_field(added, "content", where);
      if (content.empty()) fail(where, "empty added token " + std::to_string(id));
      set_token(id, content);
      flags_[id] |= kAdded | (bool_field(added, "special", false) ? kSpecial : 0);
    }
  } catch (const json::exception& e) {
    fail(path, std::string("unexpected structure: ") + e.what());
  }
}

void Tokenizer::load_tokenizer_config(const std::string& path) {
  json doc = read_json(path);
  auto decoder = doc.find("added_tokens_decoder");
  if (decoder == doc.end()) return;
  if (!decoder->is_object()) fail(path, "added_tokens_decoder must be an object");
  for (const auto& [key, added] : decoder->items()) {
    std::string where = path + " added_tokens_decoder['" + key + "']";
    int64_t id = -1;
    try {
      id = std::stoll(key);
    } catch (const std::exception&) {
    }
    if (id < 0 || id >= kMaxTokenId || !added.is_object()) fail(where, "expected a token id mapping to an object");
    std::string content = string_field(added, "content", where);
    if (content.empty()) fail(where, "empty added token");
    set_token(static_cast<int32_t>(id), content);
    flags_[id] = kExists | kAdded | (bool_field(added, "special", false) ? kSpecial : 0);
  }
}

void Tokenizer::index_added_tokens() {
  added_.clear();
  for (size_t id = 0; id < flags_.size(); ++id)
    if (flags_[id] & kAdded) added_.push_back({token_bytes_[id], static_cast<int32_t>(id)});
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (size_t i = 0; i < added_.size(); ++i)
    added_by_first_byte_[static_cast<unsigned char>(added_[i].content[0])].push_back(static_cast<int>(i));
}

size_t Tokenizer::match_added(std::string_view text, size_t pos, int32_t& id) const {
  for (int i : added_by_first_byte_[static_cast<unsigned char>(text[pos])]) {
    const std::string& content = added_[i].content;
    if (text.compare(pos, content.size(), content) == 0) {
      id = added_[i].id;
      return content.size();
    }
  }
  return 0;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  if (size_t bad = unicode::find_invalid_utf8(text); bad != unicode::kValid)
    throw Error("text: invalid UTF-8 at byte " + std::to_string(bad));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4 + 1);
  size_t segment = 0;
  for (size_t pos = 0; pos < text.size();) {
    int32_t id = 0;
    size_t length = match_added(text, pos, id);
    if (length == 0) {
      ++pos;
      continue;
    }
    encode_segment(text.substr(segment, pos - segment), ids);
    ids.push_back(id);
    pos += length;
    segment = pos;
  }
  encode_segment(text.substr(segment), ids);
  return ids;
}

void Tokenizer::encode_segment(std::string_view text, std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  std::string normalized;
  if (nfc_ && unicode::nfc(text, normalized)) text = normalized;
  if (!split_) return encode_piece(text, ids);
  split_->split(text, [&](std::string_view piece) { encode_piece(piece, ids); });
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.size() == 1) return ids.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
  if (ignore_merges_)
    if (auto it = bytes_to_id_.find(std::string(piece)); it != bytes_to_id_.end()) return ids.push_back(it->second);

  WordCache::Line* line = nullptr;
  if (piece.size() <= WordCache::kMaxPiece) {
    line = &word_cache(serial_).line_for(piece);
    if (piece == std::string_view(line->bytes, line->length))
      return ids.insert(ids.end(), line->ids, line->ids + line->count), void();
  }
  size_t first = ids.size();
  for (char c : piece) ids.push_back(byte_id_[static_cast<unsigned char>(c)]);
  ids.resize(first + merges_.apply(ids.data() + first, piece.size()));
  size_t count = ids.size() - first;
  if (line && count <= WordCache::kMaxIds) {
    line->length = static_cast<uint8_t>(piece.size());
    line->count = static_cast<uint8_t>(count);
    std::copy(piece.begin(), piece.end(), line->bytes);
    std::copy(ids.begin() + first, ids.end(), line->ids);
  }
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    const std::string& token = token_bytes(id);
    if (!(skip_special_tokens && is_special(id))) bytes += token;
  }
  std::string text;
  text.reserve(bytes.size());
  unicode::append_utf8_lossy(bytes, /*final=*/true, text);
  return text;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& added : added_)
    if (added.content == token) return added.id;
  auto it = bytes_to_id_.find(byte_level_to_bytes(token));
  if (it == bytes_to_id_.end()) return std::nullopt;
  return it->second;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !(flags_[id] & kExists))
    throw Error("token id " + std::to_string(id) + " is not in the vocabulary (size " +
                std::to_string(vocab_size()) + ")");
  return token_bytes_[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && (flags_[id] & kSpecial);
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && id < vocab_size() && (flags_[id] & kAdded);
}

}  // namespace ellm
