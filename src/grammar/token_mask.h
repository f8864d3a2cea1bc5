#pragma once
// Constrained decoding: which tokens may come next under a grammar (engine/json_schema.h).
//
// VocabIndex is built once per tokenizer, at engine start: a trie of every token's bytes (the
// mask walks it depth first, a dead prefix skipping its whole subtree), and the tokens' shapes
// inside a string, the context-independent part. Inside a plain string almost every token is
// valid, so there the mask is a precomputed bit set (the tokens of k plain characters, for each
// k) plus a walk of the few tokens that close the string, grouped by what follows the quote.
//
// TokenConstraint is one request's state: the matcher, the scratch of the walk and the mask.
// It is made when the request is submitted; masking and accepting allocate nothing.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"

namespace ellm {

class Tokenizer;

// What a request's output must look like.
struct OutputConstraint {
  std::shared_ptr<const Grammar> grammar;  // null: free text (banned tokens still apply)
  // A thinking model writes <think>...</think> freely first: `may_think` lets it open one,
  // `in_thinking` says the prompt already opened it. The grammar starts after </think>.
  bool may_think = false, in_thinking = false;
  std::vector<std::string> banned_tokens;  // the texts of single tokens never to emit
};

// A trie in preorder: node i's subtree is [i, skip); its tokens are ids[token_begin, token_end).
struct ByteTrie {
  struct Node {
    uint8_t byte;
    uint16_t depth;  // 1 for the first byte
    int32_t skip;
    int32_t token_begin, token_end;
  };
  std::vector<Node> nodes;
  std::vector<int32_t> ids;
  int32_t max_depth = 0;
  // Entries: (bytes, id); any order.
  void build(std::vector<std::pair<std::string, int32_t>> entries);
};

class VocabIndex {
 public:
  explicit VocabIndex(const Tokenizer& tokenizer);
  int64_t vocab_size() const { return vocab_size_; }
  int32_t find(std::string_view bytes) const;  // the id of the token with exactly these bytes, or -1
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  bool in_trie(int32_t id) const { return in_trie_[size_t(id)] != 0; }

  static constexpr int kBuckets = 16;
  // The context-independent shapes of tokens inside one kind of string (JSON or Coder raw).
  struct StringShapes {
    // upto[k]: tokens of only plain characters, whole UTF-8, at most k characters (k < kBuckets).
    std::vector<std::vector<uint64_t>> upto;
    struct Counted { int32_t id, chars, pending; };
    std::vector<Counted> long_plain;   // plain, whole, kBuckets characters or more
    std::vector<Counted> open_utf8;    // plain, ending inside a character (`pending` bytes due)
    // Tokens whose plain prefix is followed by the closing byte: grouped by what follows it
    // (the suffix, closing byte first), walked once per group through `suffixes`.
    ByteTrie suffixes;  // ids are group numbers
    std::vector<std::vector<Counted>> groups;  // [group] the tokens (chars of the prefix)
    std::vector<Counted> escapes;  // JSON: plain prefix, then '\'; `pending` holds the prefix bytes
  };
  const ByteTrie& trie() const { return trie_; }
  const StringShapes& shapes(bool raw) const { return raw ? raw_ : json_; }

 private:
  void classify(bool raw, StringShapes& out) const;

  int64_t vocab_size_ = 0;
  std::vector<std::string> bytes_;
  std::vector<uint8_t> in_trie_;
  std::vector<std::pair<std::string, int32_t>> sorted_;  // for find()
  ByteTrie trie_;
  StringShapes json_, raw_;
};

class TokenConstraint {
 public:
  TokenConstraint(const OutputConstraint& constraint, std::shared_ptr<const VocabIndex> vocab,
                  std::vector<int32_t> end_tokens);

  // Sets the logits of the tokens that may not come next to -inf, given how many tokens the
  // request may still generate (this one included): when that many tokens can close the output
  // (counting a byte a token), only tokens that keep it so are allowed. Returns false when none
  // may come.
  bool mask(std::span<float> logits, int64_t remaining);
  // Takes the sampled token.
  void accept(int32_t token);
  bool complete() const;  // the output may end here
  bool finished() const { return phase_ == Phase::constrained && matcher_.finished(); }  // and must
  // The allowed set of the last mask(), one bit per token (tests and benchmarks).
  bool allowed(int32_t token) const { return allowed_[size_t(token) >> 6] >> (token & 63) & 1; }
  int64_t min_bytes() const { return matcher_.min_bytes(); }
  bool use_fast_path = true;  // false: always walk the whole trie (tests compare the two)

 private:
  enum class Phase { may_think, thinking, constrained, free };
  void compute(int64_t budget);
  void walk(size_t begin, size_t end, int64_t budget, bool overwrite);
  void fix_listed_keys(int64_t budget);
  void string_fast_path(const GrammarMatcher& from, const GrammarMatcher::StringTop& top, int64_t budget);
  void allow(int32_t id) { allowed_[size_t(id) >> 6] |= uint64_t(1) << (id & 63); }
  void set(int32_t id, bool ok) {
    const uint64_t bit = uint64_t(1) << (id & 63);
    allowed_[size_t(id) >> 6] = ok ? allowed_[size_t(id) >> 6] | bit : allowed_[size_t(id) >> 6] & ~bit;
  }

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const VocabIndex> vocab_;
  std::vector<int32_t> end_tokens_, banned_;
  int32_t think_open_ = -1, think_close_ = -1;
  Phase phase_;
  GrammarMatcher matcher_;
  std::vector<GrammarMatcher> walk_;  // [trie depth] states of the depth-first walk
  GrammarMatcher free_key_;           // the state with the listed key names dropped
  std::vector<std::string_view> listed_;  // scratch of listed_keys()
  std::vector<uint64_t> allowed_;
};

}  // namespace ellm
