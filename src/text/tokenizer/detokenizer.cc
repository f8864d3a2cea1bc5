#include "text/tokenizer/detokenizer.h"

#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/unicode.h"

namespace ellm {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  const std::string& bytes = tokenizer_.token_bytes(id);
  if (skip_special_tokens_ && tokenizer_.is_special(id)) return {};
  pending_ += bytes;
  std::string text;
  size_t consumed = unicode::append_utf8_lossy(pending_, /*final=*/false, text);
  pending_.erase(0, consumed);
  return text;
}

std::string IncrementalDetokenizer::flush() {
  std::string text;
  unicode::append_utf8_lossy(pending_, /*final=*/true, text);
  pending_.clear();
  return text;
}

}  // namespace ellm
