#include "text/tokenizer/bpe_file.h"

#include <cstdio>
#include <memory>

#include "base/error.h"

namespace ellm {
namespace {

using nlohmann::json;
using DomBuilder = nlohmann::detail::json_sax_dom_parser<json>;  // what json::parse uses inside

// Forwards events to a DOM builder, except inside model.vocab and model.merges, whose contents
// go to flat lists (the DOM gets a null there).
class TokenizerJsonSax : public nlohmann::json_sax<json> {
 public:
  TokenizerJsonSax(TokenizerJson& out, const std::string& path) : out_(out), dom_(out.doc), path_(path) {}

  bool start_object(std::size_t n) override {
    if (mode_ == kDom && at_model_field("vocab")) return enter(kVocab);
    if (mode_ != kDom) bad("an object");
    return push_container(), dom_.start_object(n);
  }
  bool end_object() override {
    if (mode_ == kVocab) return mode_ = kDom, out_.has_vocab = true;
    return pop_container(), dom_.end_object();
  }
  bool start_array(std::size_t n) override {
    if (mode_ == kDom && at_model_field("merges")) return enter(kMerges);
    if (mode_ == kMerges && merge_parts_ < 0) return merge_parts_ = 0, true;
    if (mode_ != kDom) bad("an array");
    return push_container(), dom_.start_array(n);
  }
  bool end_array() override {
    if (mode_ == kMerges && merge_parts_ >= 0) {
      if (merge_parts_ != 2) fail(where(), "merge " + std::to_string(out_.merges.size()) + " is not a pair of strings");
      merge_parts_ = -1;
      return true;
    }
    if (mode_ == kMerges) return mode_ = kDom, out_.has_merges = true;
    return pop_container(), dom_.end_array();
  }
  bool key(string_t& k) override {
    if (mode_ == kVocab) return token_ = std::move(k), true;
    if (!keys_.empty()) keys_.back() = k;
    return dom_.key(k);
  }
  bool string(string_t& s) override {
    if (mode_ == kMerges) return add_merge_part(s);
    if (mode_ != kDom) bad("a string");
    return dom_.string(s);
  }
  bool number_integer(number_integer_t v) override {
    if (mode_ == kVocab) return out_.vocab.emplace_back(std::move(token_), v), true;
    if (mode_ != kDom) bad("a number");
    return dom_.number_integer(v);
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == kVocab) return number_integer(v > INT64_MAX ? -1 : static_cast<int64_t>(v));
    if (mode_ != kDom) bad("a number");
    return dom_.number_unsigned(v);
  }
  bool number_float(number_float_t v, const string_t& s) override {
    if (mode_ != kDom) bad("a fractional number");
    return dom_.number_float(v, s);
  }
  bool boolean(bool v) override {
    if (mode_ != kDom) bad("a boolean");
    return dom_.boolean(v);
  }
  bool null() override {
    if (mode_ != kDom) bad("null");
    return dom_.null();
  }
  bool binary(binary_t& b) override { return dom_.binary(b); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    fail(path_, std::string("not valid JSON: ") + e.what());
  }

 private:
  enum Mode { kDom, kVocab, kMerges };

  // True when the next value belongs to key `field` of the top-level "model" object.
  bool at_model_field(const char* field) const {
    return keys_.size() == 2 && keys_[0] == "model" && keys_[1] == field;
  }
  bool enter(Mode mode) {
    mode_ = mode;
    return dom_.null();
  }
  void push_container() { keys_.emplace_back(); }
  void pop_container() {
    if (!keys_.empty()) keys_.pop_back();
  }
  bool add_merge_part(string_t& s) {
    if (merge_parts_ < 0) {  // older files spell a merge as one string "left right"
      size_t space = s.find(' ', 1);
      if (space == std::string::npos) fail(where(), "merge " + std::to_string(out_.merges.size()) + " is not 'left right'");
      out_.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (merge_parts_ == 0) {
      out_.merges.emplace_back(std::move(s), std::string());
      merge_parts_ = 1;
    } else if (merge_parts_ == 1) {
      out_.merges.back().second = std::move(s);
      merge_parts_ = 2;
    } else {
      fail(where(), "merge " + std::to_string(out_.merges.size() - 1) + " has more than two parts");
    }
    return true;
  }
  std::string where() const { return path_ + (mode_ == kVocab ? " model.vocab" : " model.merges"); }
  [[noreturn]] void bad(const char* what) const {
    fail(where(), std::string("unexpected ") + what +
                      (mode_ == kVocab ? " (expected token -> integer id)" : " (expected [left, right] pairs)"));
  }

  TokenizerJson& out_;
  DomBuilder dom_;
  const std::string& path_;
  Mode mode_ = kDom;
  std::vector<std::string> keys_;  // the current key at each open object/array level
  std::string token_;              // vocab key awaiting its id
  int merge_parts_ = -1;           // strings seen in the current [left, right] pair, -1 outside one
};

}  // namespace

std::string read_file_bytes(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) fail(path, "cannot open file");
  std::string bytes;
  if (std::fseek(file.get(), 0, SEEK_END) == 0) {
    long size = std::ftell(file.get());
    if (size > 0) bytes.reserve(static_cast<size_t>(size));
    std::rewind(file.get());
  }
  char buffer[1 << 16];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file.get())) > 0;) bytes.append(buffer, n);
  if (std::ferror(file.get())) fail(path, "cannot read file");
  return bytes;
}

TokenizerJson read_tokenizer_json(const std::string& path) {
  std::string bytes = read_file_bytes(path);
  TokenizerJson out;
  out.vocab.reserve(bytes.size() / 64);
  out.merges.reserve(bytes.size() / 64);
  TokenizerJsonSax sax(out, path);
  json::sax_parse(bytes, &sax);
  if (!out.doc.is_object()) fail(path, "expected a JSON object at the top level");
  return out;
}

}  // namespace ellm
