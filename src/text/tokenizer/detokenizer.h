#pragma once
// Streaming decode: text appears as soon as it is complete UTF-8, never a broken character.
#include <cstdint>
#include <string>

namespace ellm {

class Tokenizer;

// Push ids one at a time; the concatenation of all push() results plus flush() equals
// Tokenizer::decode(all ids, skip_special_tokens).
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);
  std::string push(int32_t id);  // throws Error on an unknown id
  // Whatever is left; an incomplete character at the very end becomes U+FFFD, as in decode().
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;  // bytes of an unfinished character (at most 3)
};

}  // namespace ellm
