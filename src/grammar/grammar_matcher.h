#pragma once
// Walks a Grammar (engine/json_schema.h) one byte at a time. The state is a few threads (one
// per anyOf alternative still possible), each a stack of frames (one per value being written);
// everything lives in fixed arrays, so feeding bytes and copying a state allocate nothing.
//
// It also knows the fewest bytes that complete the output from the current state (min_bytes),
// which lets the token mask keep the output closable within the remaining token budget: every
// single byte is a token, so a state needing k bytes can always be closed in k tokens.
#include <cstdint>
#include <string_view>
#include <vector>

#include "grammar/json_schema.h"

namespace ellm {

constexpr int kEndOfOutput = 256;  // fed like a byte: "the output ends here"

class GrammarMatcher {
 public:
  static constexpr int kMaxFrames = 24, kMaxThreads = 8;

  GrammarMatcher() = default;
  explicit GrammarMatcher(const Grammar* grammar) { reset(grammar); }
  void reset(const Grammar* grammar);
  // Copies the live part of `other` only (a full copy would be kilobytes).
  void copy_from(const GrammarMatcher& other);

  // Feeds one byte (or kEndOfOutput); false when no thread accepts it (the state is then dead).
  bool feed(int byte);
  bool feed(const char* bytes, size_t size);
  bool dead() const { return threads_ == 0; }
  bool can_end() const;   // the output may stop here
  bool finished() const;  // the output is complete and nothing may follow
  int64_t min_bytes() const;  // fewest bytes that complete the output

  // The token mask's fast path: a single thread whose next bytes are the characters of a plain
  // string (no pattern, not in an escape or a multi-byte character, no key names to match).
  struct StringTop {
    bool raw = false;          // Qwen3-Coder value: ends at '\n' rather than '"'
    int32_t count = 0;         // characters so far
    int32_t min_length = 0, max_length = -1;
    int64_t rest_bytes = 0;    // min_bytes() minus what closing this string itself needs
  };
  bool string_top(StringTop& out) const;
  // Counts `chars` characters into the string on top (the fast path's plain prefix).
  void add_string_chars(int32_t chars);
  // A single thread in an object key that may be a listed name or an additional property.
  bool listed_or_free_key() const;
  void drop_listed_keys();  // then it may only be an additional property (a plain string)
  // The rest of each listed name still possible there (into `out`, which keeps its capacity).
  std::vector<std::string_view>& listed_keys(std::vector<std::string_view>& out) const;

  struct Frame {
    int32_t node = -1;
    uint8_t stage = 0;
    uint8_t utf8_left = 0;  // continuation bytes still due in a string
    uint8_t free_key = 0;   // object key: it may still be an additional property
    uint8_t unused = 0;
    int32_t pos = 0;        // bytes matched of a literal or key
    int32_t count = 0;      // characters of a string, items of an array, repeats
    int32_t lo = 0, hi = 0; // candidate literals / keys [lo, hi); an object's value node in hi
    uint64_t bits = 0;      // object: properties seen; string: pattern state
  };

 private:
  struct Thread {
    int32_t depth = 0;
    Frame frames[kMaxFrames];
  };
  enum class Step { consumed, dead, pop_consumed, pop_retry, retry, fork };

  bool run(int thread, int byte);
  Step step(Thread& t, Frame& f, int byte);
  Step string_byte(Frame& f, const GrammarNode& n, int byte, bool key);
  Step integer_byte(Frame& f, const GrammarNode& n, int byte);
  int digits_to_bounds(const Frame& f, const GrammarNode& n) const;
  Step key_byte(Thread& t, Frame& f, const GrammarNode& n, int byte);
  Step literal_byte(Frame& f, const GrammarNode& n, int byte);
  bool push(Thread& t, int32_t node);
  bool key_allowed(const Frame& f, const GrammarNode& n, int32_t property) const;
  int64_t thread_bytes(const Thread& t) const;
  int64_t frame_bytes(const Frame& f) const;
  int64_t string_bytes(const Frame& f, const GrammarNode& n, bool key) const;
  int64_t missing_bytes(const Frame& f, const GrammarNode& n, int32_t except) const;

  const Grammar* g_ = nullptr;
  int32_t threads_ = 0;
  Thread thread_[kMaxThreads];
};

}  // namespace ellm
