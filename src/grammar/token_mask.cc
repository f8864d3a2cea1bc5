#include "grammar/token_mask.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <limits>
#include <map>

#include "text/tokenizer/tokenizer.h"

namespace ellm {

void ByteTrie::build(std::vector<std::pair<std::string, int32_t>> entries) {
  std::sort(entries.begin(), entries.end());
  nodes.clear();
  ids.clear();
  max_depth = 0;
  std::vector<int32_t> stack;  // the path to the last token's node
  const std::string* previous = nullptr;
  for (const auto& [bytes, id] : entries) {
    if (bytes.empty()) continue;
    size_t common = 0;
    if (previous)
      while (common < previous->size() && common < bytes.size() && (*previous)[common] == bytes[common]) ++common;
    while (stack.size() > common) {
      nodes[size_t(stack.back())].skip = int32_t(nodes.size());
      stack.pop_back();
    }
    for (size_t d = common; d < bytes.size(); ++d) {
      nodes.push_back({uint8_t(bytes[d]), uint16_t(d + 1), -1, int32_t(ids.size()), int32_t(ids.size())});
      stack.push_back(int32_t(nodes.size() - 1));
    }
    ids.push_back(id);
    nodes[size_t(stack.back())].token_end = int32_t(ids.size());
    max_depth = std::max(max_depth, int32_t(bytes.size()));
    previous = &bytes;
  }
  for (int32_t i : stack) nodes[size_t(i)].skip = int32_t(nodes.size());
}

VocabIndex::VocabIndex(const Tokenizer& tokenizer) : vocab_size_(tokenizer.vocab_size()) {
  bytes_.resize(size_t(vocab_size_));
  in_trie_.assign(size_t(vocab_size_), 0);
  std::vector<std::pair<std::string, int32_t>> entries;
  for (int32_t id = 0; id < vocab_size_; ++id) {
    bytes_[size_t(id)] = tokenizer.token_bytes(id);
    if (bytes_[size_t(id)].empty()) continue;
    sorted_.emplace_back(bytes_[size_t(id)], id);
    if (tokenizer.is_special(id)) continue;  // <|im_end|> and the like end or frame, never spell
    in_trie_[size_t(id)] = 1;
    entries.emplace_back(bytes_[size_t(id)], id);
  }
  std::sort(sorted_.begin(), sorted_.end());
  trie_.build(std::move(entries));
  classify(false, json_);
  classify(true, raw_);
}

int32_t VocabIndex::find(std::string_view bytes) const {
  auto it = std::lower_bound(sorted_.begin(), sorted_.end(), bytes,
                             [](const auto& entry, std::string_view b) { return entry.first < b; });
  return it != sorted_.end() && it->first == bytes ? it->second : -1;
}

void VocabIndex::classify(bool raw, StringShapes& out) const {
  const size_t words = size_t((vocab_size_ + 63) / 64);
  out.upto.assign(kBuckets, std::vector<uint64_t>(words, 0));
  auto plain = [raw](uint8_t b) {
    return b >= 0x20 && b != 0x7f && (raw ? b != '<' : (b != '"' && b != '\\'));
  };
  const uint8_t closing = raw ? '\n' : '"';
  std::map<std::string, int32_t> group_of;
  std::vector<std::pair<std::string, int32_t>> suffixes;
  for (int32_t id = 0; id < vocab_size_; ++id) {
    if (!in_trie_[size_t(id)]) continue;
    const std::string& b = bytes_[size_t(id)];
    int32_t chars = 0, pending = 0;
    size_t i = 0;
    bool broken = false;
    for (; i < b.size(); ++i) {
      const uint8_t c = uint8_t(b[i]);
      if (pending > 0) {
        if (c < 0x80 || c > 0xbf) { broken = true; break; }
        --pending;
      } else if (c >= 0xc2 && c <= 0xf4) {
        ++chars, pending = c <= 0xdf ? 1 : c <= 0xef ? 2 : 3;
      } else if (c < 0x80 && plain(c)) {
        ++chars;
      } else {
        broken = c >= 0x80;
        break;
      }
    }
    if (broken) continue;
    if (i == b.size()) {
      if (pending > 0) out.open_utf8.push_back({id, chars, pending});
      else if (chars < kBuckets) out.upto[size_t(chars)][size_t(id) >> 6] |= uint64_t(1) << (id & 63);
      else out.long_plain.push_back({id, chars, 0});
    } else if (pending == 0 && uint8_t(b[i]) == closing) {
      auto [it, added] = group_of.emplace(b.substr(i), int32_t(out.groups.size()));
      if (added) {
        out.groups.emplace_back();
        suffixes.emplace_back(it->first, it->second);
      }
      out.groups[size_t(it->second)].push_back({id, chars, 0});
    } else if (pending == 0 && !raw && b[i] == '\\') {
      out.escapes.push_back({id, chars, int32_t(i)});
    }
  }
  for (int k = 1; k < kBuckets; ++k)
    for (size_t w = 0; w < words; ++w) out.upto[size_t(k)][w] |= out.upto[size_t(k - 1)][w];
  out.suffixes.build(std::move(suffixes));
}

TokenConstraint::TokenConstraint(const OutputConstraint& constraint, std::shared_ptr<const VocabIndex> vocab,
                                 std::vector<int32_t> end_tokens)
    : grammar_(constraint.grammar), vocab_(std::move(vocab)), end_tokens_(std::move(end_tokens)) {
  for (const std::string& text : constraint.banned_tokens)
    if (int32_t id = vocab_->find(text); id >= 0) banned_.push_back(id);
  think_open_ = vocab_->find("<think>");
  think_close_ = vocab_->find("</think>");
  phase_ = Phase::constrained;
  if (!grammar_) phase_ = Phase::free;
  else if (constraint.in_thinking && think_close_ >= 0) phase_ = Phase::thinking;
  else if (constraint.may_think && think_open_ >= 0 && think_close_ >= 0) phase_ = Phase::may_think;
  allowed_.assign(size_t((vocab_->vocab_size() + 63) / 64), 0);
  if (!grammar_) return;
  matcher_.reset(grammar_.get());
  walk_.resize(size_t(std::max(vocab_->trie().max_depth, 1) + 1));
  listed_.reserve(64);  // an object lists at most 63 properties
}

namespace {

// [byte][bit]: 0 where the bit is set (allowed), -inf where it is not.
const auto kByteMask = [] {
  std::array<std::array<float, 8>, 256> table;
  for (size_t b = 0; b < 256; ++b)
    for (size_t j = 0; j < 8; ++j) table[b][j] = b >> j & 1 ? 0.0f : -std::numeric_limits<float>::infinity();
  return table;
}();

}  // namespace

bool TokenConstraint::mask(std::span<float> logits, int64_t remaining) {
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  const int64_t budget = remaining - 1;  // tokens left after this one
  if (phase_ == Phase::free || phase_ == Phase::thinking) {
    std::fill(allowed_.begin(), allowed_.end(), ~uint64_t(0));
    for (int32_t id : banned_)
      if (size_t(id) < logits.size()) logits[size_t(id)] = kNever;
    if (phase_ == Phase::free) return true;
    for (int32_t id : end_tokens_)
      if (size_t(id) < logits.size()) logits[size_t(id)] = kNever;
    // The reasoning may take the budget only down to what closes it and writes the output.
    if (budget >= 1 + grammar_->nodes[size_t(grammar_->root)].min_bytes) return true;
    std::fill(allowed_.begin(), allowed_.end(), 0);
    allow(think_close_);
  } else {
    // Too few tokens to close the output even a byte a token: multi-byte tokens may still make
    // it, so the grammar alone applies until the end is within reach, and then it is kept so.
    // Alone, it still refuses what can never end (the matcher's "far", e.g. a key not allowed yet).
    constexpr int64_t kAnyEnd = INT64_MAX / 4 - 1;
    compute(matcher_.min_bytes() > remaining ? kAnyEnd : budget);
    if (phase_ == Phase::may_think && budget >= 1 + grammar_->nodes[size_t(grammar_->root)].min_bytes) allow(think_open_);
    if (matcher_.can_end())
      for (int32_t id : end_tokens_) allow(id);
    for (int32_t id : banned_) allowed_[size_t(id) >> 6] &= ~(uint64_t(1) << (id & 63));
  }
  bool any = false;
  const size_t n = logits.size();
  for (size_t w = 0; w * 64 < n; ++w) {
    const uint64_t bits = w < allowed_.size() ? allowed_[w] : 0;
    const size_t end = std::min(n, w * 64 + 64);
    any |= bits != 0;
    if (bits == ~uint64_t(0)) continue;
    if (end - w * 64 < 64) {
      for (size_t id = w * 64; id < end; ++id)
        if (!(bits >> (id & 63) & 1)) logits[id] = kNever;
      continue;
    }
    float* out = logits.data() + w * 64;
    if (bits == 0) {  // most words, under a grammar (a fixed count, so it is vectorised)
      for (size_t j = 0; j < 64; ++j) out[j] = kNever;
      continue;
    }
    // Adding 0 or -inf by each byte of the word: branch-free, eight floats at a time.
    for (size_t k = 0; k < 8; ++k) {
      const float* add = kByteMask[(bits >> (8 * k)) & 0xff].data();
      for (size_t j = 0; j < 8; ++j) out[8 * k + j] += add[j];
    }
  }
  return any;
}

void TokenConstraint::accept(int32_t token) {
  switch (phase_) {
    case Phase::free: return;
    case Phase::thinking:
      if (token == think_close_) phase_ = Phase::constrained;
      return;
    case Phase::may_think:
      phase_ = token == think_open_ ? Phase::thinking : Phase::constrained;
      if (phase_ == Phase::thinking) return;
      break;
    case Phase::constrained: break;
  }
  if (std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end()) return;
  if (token < 0 || token >= vocab_->vocab_size()) return;
  const std::string& bytes = vocab_->bytes(token);
  matcher_.feed(bytes.data(), bytes.size());  // a token the mask refused kills the state
}

bool TokenConstraint::complete() const {
  if (phase_ == Phase::free) return true;
  return phase_ == Phase::constrained && matcher_.can_end();
}

void TokenConstraint::compute(int64_t budget) {
  std::fill(allowed_.begin(), allowed_.end(), 0);
  if (matcher_.dead()) return;
  GrammarMatcher::StringTop top;
  if (use_fast_path && matcher_.string_top(top)) {
    string_fast_path(matcher_, top, budget);
  } else if (use_fast_path && matcher_.listed_or_free_key()) {
    // A key that may be a listed name or an additional one: as if it could only be additional,
    // then the tokens that spell a listed name, or go past one, as the real state says.
    free_key_.copy_from(matcher_);
    free_key_.drop_listed_keys();
    free_key_.string_top(top);
    string_fast_path(free_key_, top, budget);
    fix_listed_keys(budget);
  } else {
    walk_[0].copy_from(matcher_);
    walk(0, vocab_->trie().nodes.size(), budget, /*overwrite=*/false);
  }
}

// Depth-first over trie nodes [begin, end), whose parents' states are in walk_: a token is
// allowed if its state lives and can still close in the budget. `overwrite`: refused ones are
// cleared too (over a mask made another way), a dead prefix's whole subtree included.
void TokenConstraint::walk(size_t begin, size_t end, int64_t budget, bool overwrite) {
  const ByteTrie& trie = vocab_->trie();
  for (size_t i = begin; i < end;) {
    const ByteTrie::Node& node = trie.nodes[i];
    GrammarMatcher& state = walk_[node.depth];
    state.copy_from(walk_[node.depth - 1u]);
    const bool alive = state.feed(node.byte);
    const size_t next = alive ? i + 1 : size_t(node.skip);
    const bool ok = alive && state.min_bytes() <= budget;
    if (overwrite || ok) {
      const int32_t last = alive ? node.token_end : next < trie.nodes.size() ? trie.nodes[next].token_begin : int32_t(trie.ids.size());
      for (int32_t t = node.token_begin; t < last; ++t) set(trie.ids[size_t(t)], ok);
    }
    i = next;
  }
}

// The trie along each listed name still possible: the tokens on the way and below its end.
void TokenConstraint::fix_listed_keys(int64_t budget) {
  const ByteTrie& trie = vocab_->trie();
  walk_[0].copy_from(matcher_);
  for (std::string_view rest : matcher_.listed_keys(listed_)) {
    size_t node = 0, end = trie.nodes.size();  // the siblings to search: [node, end)
    for (size_t k = 0; k < rest.size(); ++k) {
      while (node < end && trie.nodes[node].byte != uint8_t(rest[k])) node = size_t(trie.nodes[node].skip);
      if (node >= end) break;
      const ByteTrie::Node& n = trie.nodes[node];
      walk(node, node + 1, budget, true);  // this node's own tokens (its state goes to walk_[k + 1])
      if (walk_[k + 1].dead()) break;
      if (k + 1 == rest.size()) walk(node + 1, size_t(n.skip), budget, true);
      end = size_t(n.skip);
      ++node;
    }
  }
}

void TokenConstraint::string_fast_path(const GrammarMatcher& from, const GrammarMatcher::StringTop& top,
                                       int64_t budget) {
  const VocabIndex::StringShapes& shapes = vocab_->shapes(top.raw);
  const int64_t room = top.max_length < 0 ? INT32_MAX : top.max_length - top.count;  // characters
  const int64_t deficit = std::max(0, top.min_length - top.count);
  const int64_t slack = budget - top.rest_bytes - (top.raw ? 0 : 1);  // bytes left for characters
  // Plain tokens keep the string open: they fit if the characters they add leave at most
  // `slack` of the minimum length still to write.
  if (slack >= 0) {
    const int64_t lower = std::max<int64_t>(1, deficit - slack), upper = room;
    if (lower <= upper && lower < VocabIndex::kBuckets) {
      const auto& high = shapes.upto[size_t(std::min<int64_t>(upper, VocabIndex::kBuckets - 1))];
      const auto& low = shapes.upto[size_t(lower - 1)];
      for (size_t w = 0; w < allowed_.size(); ++w) allowed_[w] |= high[w] & ~low[w];
    }
    for (const auto& t : shapes.long_plain)
      if (t.chars >= lower && t.chars <= upper) allow(t.id);
    for (const auto& t : shapes.open_utf8)
      if (t.chars <= room && std::max<int64_t>(0, deficit - t.chars) + t.pending <= slack) allow(t.id);
  }
  // Tokens that close the string: what follows the closing byte does not depend on the
  // string, so each distinct suffix is walked once, from a state where the string is long enough.
  const ByteTrie& suffixes = shapes.suffixes;
  walk_[0].copy_from(from);
  walk_[0].add_string_chars(int32_t(deficit));
  for (size_t i = 0; i < suffixes.nodes.size();) {
    const ByteTrie::Node& node = suffixes.nodes[i];
    GrammarMatcher& state = walk_[node.depth];
    state.copy_from(walk_[node.depth - 1u]);
    if (!state.feed(node.byte)) {
      i = size_t(node.skip);
      continue;
    }
    if (node.token_begin < node.token_end && state.min_bytes() <= budget)
      for (int32_t g = node.token_begin; g < node.token_end; ++g)
        for (const auto& t : shapes.groups[size_t(suffixes.ids[size_t(g)])])
          if (t.chars >= deficit && t.chars <= room) allow(t.id);
    ++i;
  }
  // Escapes continue the string: each is walked.
  for (const auto& t : shapes.escapes) {
    if (t.chars + 1 > room) continue;
    GrammarMatcher& state = walk_[1];
    state.copy_from(from);
    state.add_string_chars(t.chars);
    const std::string& bytes = vocab_->bytes(t.id);
    if (state.feed(bytes.data() + t.pending, bytes.size() - size_t(t.pending)) && state.min_bytes() <= budget) allow(t.id);
  }
}

}  // namespace ellm
