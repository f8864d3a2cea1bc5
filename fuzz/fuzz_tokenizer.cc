// libFuzzer target: encode arbitrary bytes and decode arbitrary ids with the real Qwen3
// tokenizer. Invalid input may throw ellm::Error; anything else (crash, hang, sanitizer report,
// a broken round trip) is a bug.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/unicode.h"

#ifndef ELLM_SHARED
#define ELLM_SHARED "../shared"
#endif

namespace {

const ellm::Tokenizer& tokenizer() {
  static auto t = [] {
    const char* shared = std::getenv("ELLM_SHARED");
    return ellm::Tokenizer::load(std::string(shared ? shared : ELLM_SHARED) + "/text/qwen3");
  }();
  return *t;
}

}  // namespace

// Loading the tokenizer takes seconds in an instrumented build: done here, it does not count
// against the first input's -timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ellm::Tokenizer& t = tokenizer();
  std::string_view text(reinterpret_cast<const char*>(data), size);

  // Encode: valid UTF-8 must round-trip (up to NFC), invalid UTF-8 must throw.
  bool valid = ellm::unicode::find_invalid_utf8(text) == ellm::unicode::kValid;
  try {
    std::vector<int32_t> ids = t.encode(text);
    if (!valid) std::abort();
    std::string decoded = t.decode(ids, false);
    std::string normalized(text);
    std::string nfc;
    if (ellm::unicode::nfc(text, nfc)) normalized = nfc;
    if (decoded != normalized) std::abort();
  } catch (const ellm::Error&) {
    if (valid) std::abort();
  }

  // Decode: the bytes as ids (in and out of range); streaming must equal one-shot decoding.
  std::vector<int32_t> ids(size / 4);
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
  for (int32_t& id : ids) id %= static_cast<int32_t>(t.vocab_size() + 8);  // mostly valid ids
  for (bool skip : {false, true}) {
    std::string whole;
    try {
      whole = t.decode(ids, skip);
    } catch (const ellm::Error&) {
      continue;  // an unknown id
    }
    ellm::IncrementalDetokenizer detok(t, skip);
    std::string streamed;
    for (int32_t id : ids) streamed += detok.push(id);
    streamed += detok.flush();
    if (streamed != whole) std::abort();
  }
  return 0;
}
