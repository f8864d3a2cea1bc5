// The byte-level walk over grammar nodes. A parent sets the stage it returns to before it pushes
// a child, so finishing a child is just a pop. Values that may end without a closing byte
// (numbers, Qwen3-Coder strings, an enum whose literal is a prefix of another) end when the next
// byte cannot continue them: it is then handed to the parent (pop_retry).
#include "grammar/grammar_matcher.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace ellm {

namespace {

enum Stage : uint8_t {
  kStart,
  kStr, kStrEscape, kStrHex,
  kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac,
  kWord,
  kArrayOpen, kArrayAfter, kArrayComma, kArraySpace,
  kObjectOpen, kObjectKey, kObjectColon, kObjectSpace, kObjectValue, kObjectAfter, kObjectComma,
  kObjectCommaSpace, kParamClose,
  kLiteral, kSequence, kRepeatAfter, kRepeatSeparator,
};

constexpr const char* kWords[] = {"true", "false", "null"};
constexpr int64_t kFar = INT64_MAX / 4;

bool is_digit(int b) { return b >= '0' && b <= '9'; }
bool is_hex(int b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }
int64_t plus(int64_t a, int64_t b) { return std::min(kFar, a + b); }

}  // namespace

void GrammarMatcher::reset(const Grammar* grammar) {
  g_ = grammar;
  threads_ = 1;
  thread_[0].depth = 0;
  push(thread_[0], grammar->root);
}

void GrammarMatcher::copy_from(const GrammarMatcher& other) {
  g_ = other.g_;
  threads_ = other.threads_;
  for (int i = 0; i < threads_; ++i) {
    thread_[i].depth = other.thread_[i].depth;
    std::memcpy(thread_[i].frames, other.thread_[i].frames, sizeof(Frame) * size_t(other.thread_[i].depth));
  }
}

bool GrammarMatcher::push(Thread& t, int32_t node) {
  if (t.depth == kMaxFrames) return false;
  Frame& f = t.frames[t.depth++];
  f = Frame{};
  f.node = node;
  const GrammarNode& n = g_->nodes[node];
  switch (n.kind) {
    case NodeKind::literal_set:
      f.stage = kLiteral;
      f.hi = int32_t(n.literals.size());
      break;
    case NodeKind::sequence: f.stage = kSequence; break;
    case NodeKind::value:
      if (n.coder) f.stage = kObjectKey, f.hi = int32_t(n.properties.size());
      else if (n.raw) f.stage = kStr, f.bits = kRegexStart;
      break;
    default: break;
  }
  return true;
}

bool GrammarMatcher::feed(int byte) {
  for (int i = 0; i < threads_; ++i)  // forks append threads, which this loop then feeds too
    if (!run(i, byte)) thread_[i].depth = -1;
  int live = 0;
  for (int i = 0; i < threads_; ++i)
    if (thread_[i].depth >= 0) {
      if (live != i) {
        thread_[live].depth = thread_[i].depth;
        std::memcpy(thread_[live].frames, thread_[i].frames, sizeof(Frame) * size_t(thread_[i].depth));
      }
      ++live;
    }
  threads_ = live;
  return live > 0;
}

bool GrammarMatcher::feed(const char* bytes, size_t size) {
  for (size_t i = 0; i < size; ++i)
    if (!feed(uint8_t(bytes[i]))) return false;
  return true;
}

bool GrammarMatcher::can_end() const {
  GrammarMatcher copy;
  copy.copy_from(*this);
  return copy.feed(kEndOfOutput);
}

bool GrammarMatcher::finished() const {
  for (int i = 0; i < threads_; ++i)
    if (thread_[i].depth > 0) return false;
  return threads_ > 0;
}

bool GrammarMatcher::run(int index, int byte) {
  Thread& t = thread_[index];
  for (int guard = 0; guard < 4 * kMaxFrames + 8; ++guard) {
    if (t.depth == 0) return byte == kEndOfOutput;
    Frame& f = t.frames[t.depth - 1];
    switch (step(t, f, byte)) {
      case Step::consumed: return true;
      case Step::dead: return false;
      case Step::pop_consumed: --t.depth; return true;
      case Step::pop_retry: --t.depth; break;
      case Step::retry: break;
      case Step::fork: {
        const std::vector<int32_t>& alternatives = g_->nodes[f.node].children;
        --t.depth;
        for (size_t a = 1; a < alternatives.size() && threads_ < kMaxThreads; ++a) {
          Thread& copy = thread_[threads_++];
          copy.depth = t.depth;
          std::memcpy(copy.frames, t.frames, sizeof(Frame) * size_t(t.depth));
          if (!push(copy, alternatives[a])) copy.depth = -1, --threads_;
        }
        if (!push(t, alternatives[0])) return false;
        break;
      }
    }
  }
  return false;
}

GrammarMatcher::Step GrammarMatcher::step(Thread& t, Frame& f, int b) {
  const GrammarNode& n = g_->nodes[f.node];
  switch (f.stage) {
    case kStart:
      if (n.kind == NodeKind::choice) return Step::fork;
      if (n.kind == NodeKind::repeat) {
        f.stage = kRepeatAfter, f.count = 1;
        return push(t, n.children[0]) ? Step::retry : Step::dead;
      }
      if (b == '{' && (n.types & kObject)) return f.stage = kObjectOpen, Step::consumed;
      if (b == '[' && (n.types & kArray)) return f.stage = kArrayOpen, Step::consumed;
      if (b == '"' && (n.types & kString)) return f.stage = kStr, f.bits = kRegexStart, Step::consumed;
      if ((n.types & (kInteger | kNumber)) && (b == '-' || is_digit(b))) return integer_byte(f, n, b);
      if ((b == 't' || b == 'f') && (n.types & kBool)) return f.stage = kWord, f.lo = b == 't' ? 0 : 1, f.pos = 1, Step::consumed;
      if (b == 'n' && (n.types & kNull)) return f.stage = kWord, f.lo = 2, f.pos = 1, Step::consumed;
      return Step::dead;
    case kStr: case kStrEscape: case kStrHex:
      return string_byte(f, n, b, false);
    case kNumMinus:
      return is_digit(b) ? integer_byte(f, n, b) : Step::dead;
    case kNumZero: case kNumInt:
      if (is_digit(b)) return integer_byte(f, n, b);
      if (b == '.' && (n.types & kNumber)) return f.stage = kNumDot, f.count = 0, Step::consumed;
      return n.bounded && digits_to_bounds(f, n) != 0 ? Step::dead : Step::pop_retry;
    case kNumDot:
      if (is_digit(b)) return f.stage = kNumFrac, f.count = 1, Step::consumed;
      return Step::dead;
    case kNumFrac:
      if (is_digit(b)) return f.count < kMaxFractionDigits ? (++f.count, Step::consumed) : Step::dead;
      return Step::pop_retry;
    case kWord: {
      const char* word = kWords[f.lo];
      if (b != word[f.pos]) return Step::dead;
      return word[++f.pos] == 0 ? Step::pop_consumed : Step::consumed;
    }
    case kArrayOpen:
      if (b == ']' && n.min_items == 0) return Step::pop_consumed;
      if (n.max_items == 0) return Step::dead;
      f.stage = kArrayAfter, f.count = 1;
      return push(t, n.items) ? Step::retry : Step::dead;
    case kArrayAfter:
      if (b == ',' && (n.max_items < 0 || f.count < n.max_items)) return f.stage = kArrayComma, Step::consumed;
      if (b == ']' && f.count >= n.min_items) return Step::pop_consumed;
      return Step::dead;
    case kArrayComma: case kArraySpace:
      if (b == ' ' && f.stage == kArrayComma) return f.stage = kArraySpace, Step::consumed;
      f.stage = kArrayAfter, ++f.count;
      return push(t, n.items) ? Step::retry : Step::dead;
    case kObjectOpen: case kObjectComma: case kObjectCommaSpace:
      if (b == '}' && f.stage == kObjectOpen && !(n.required_bits & ~f.bits)) return Step::pop_consumed;
      if (b == ' ' && f.stage == kObjectComma) return f.stage = kObjectCommaSpace, Step::consumed;
      if (b != '"') return Step::dead;
      f.stage = kObjectKey, f.pos = 1, f.lo = 0, f.hi = int32_t(n.properties.size());
      f.free_key = n.additional >= 0, f.count = 0, f.utf8_left = 0;
      return Step::consumed;
    case kObjectKey:
      return key_byte(t, f, n, b);
    case kObjectColon:
      return b == ':' ? (f.stage = kObjectSpace, Step::consumed) : Step::dead;
    case kObjectSpace: case kObjectValue:
      if (b == ' ' && f.stage == kObjectSpace) return f.stage = kObjectValue, Step::consumed;
      f.stage = kObjectAfter;
      return push(t, f.hi) ? Step::retry : Step::dead;
    case kObjectAfter: {
      const bool missing = n.required_bits & ~f.bits;
      if (b == '}' && !missing) return Step::pop_consumed;
      if (b != ',') return Step::dead;
      bool more = n.additional >= 0;
      for (size_t p = 0; p < n.properties.size() && !more; ++p) more = key_allowed(f, n, int32_t(p));
      return more ? (f.stage = kObjectComma, Step::consumed) : Step::dead;
    }
    case kParamClose:
      if (b != uint8_t(kCoderClose[f.pos])) return Step::dead;
      if (++f.pos == int32_t(kCoderClose.size())) f.stage = kObjectKey, f.pos = 0, f.lo = 0, f.hi = int32_t(n.properties.size());
      return Step::consumed;
    case kLiteral:
      return literal_byte(f, n, b);
    case kSequence:
      if (f.pos == int32_t(n.children.size())) return Step::pop_retry;
      return push(t, n.children[f.pos++]) ? Step::retry : Step::dead;
    case kRepeatAfter: {
      const std::string& separator = g_->nodes[n.children[1]].literals[0];
      if (b == uint8_t(separator[0]) && f.count < n.max_count) {
        f.stage = kRepeatSeparator;
        return push(t, n.children[1]) ? Step::retry : Step::dead;
      }
      return f.count >= n.min_count ? Step::pop_retry : Step::dead;
    }
    case kRepeatSeparator:
      f.stage = kRepeatAfter, ++f.count;
      return push(t, n.children[0]) ? Step::retry : Step::dead;
  }
  return Step::dead;
}

// The sign or a digit of a number's integer part (count: its digits; bits: their value; lo: 1
// when negative). A bounded integer's digits must still be able to end within its bounds.
GrammarMatcher::Step GrammarMatcher::integer_byte(Frame& f, const GrammarNode& n, int b) {
  if (b == '-') {
    f.stage = kNumMinus, f.lo = 1;
  } else {
    if (f.stage == kNumZero || f.count == kMaxIntegerDigits) return Step::dead;
    f.stage = b == '0' && f.count == 0 ? kNumZero : kNumInt;
    f.bits = f.bits * 10 + uint64_t(b - '0');
    ++f.count;
  }
  return n.bounded && digits_to_bounds(f, n) < 0 ? Step::dead : Step::consumed;
}

// The fewest digits that end the integer so far within [n.minimum, n.maximum]; -1: none can.
int GrammarMatcher::digits_to_bounds(const Frame& f, const GrammarNode& n) const {
  const int64_t magnitude = int64_t(f.bits);
  int64_t scale = 1;  // 10^more
  for (int more = 0; f.count + more <= kMaxIntegerDigits; ++more, scale *= 10) {
    if (f.count == 0 && more == 0) continue;     // a sign alone is no number
    if (f.stage == kNumZero && more > 0) break;  // nothing follows a leading 0
    // The magnitudes `more` digits can make: no leading zero when there are no digits yet.
    const int64_t low = f.count == 0 && more > 1 ? scale / 10 : magnitude * scale, high = magnitude * scale + scale - 1;
    const int64_t from = f.lo ? -high : low, to = f.lo ? -low : high;
    if (from <= n.maximum && to >= n.minimum) return more;
  }
  return -1;
}

// One byte of a string body (or of an object key that may be an additional property).
GrammarMatcher::Step GrammarMatcher::string_byte(Frame& f, const GrammarNode& n, int b, bool key) {
  const int32_t min_length = key ? 0 : n.min_length, max_length = key ? -1 : n.max_length;
  const Regex* regex = !key && n.regex >= 0 ? &g_->regexes[n.regex] : nullptr;
  const bool raw = !key && n.raw;
  if (f.utf8_left > 0) {
    if (b < 0x80 || b > 0xbf) return Step::dead;
    --f.utf8_left;
    return Step::consumed;
  }
  if (f.stage == kStrEscape) {
    if (b == 'u') return f.stage = kStrHex, f.pos = 0, Step::consumed;
    if (b != '"' && b != '\\' && b != '/' && b != 'b' && b != 'f' && b != 'n' && b != 'r' && b != 't') return Step::dead;
    return f.stage = kStr, ++f.count, Step::consumed;
  }
  if (f.stage == kStrHex) {
    if (!is_hex(b)) return Step::dead;
    if (++f.pos == 4) f.stage = kStr, ++f.count;
    return Step::consumed;
  }
  const bool closes = raw ? (b == '\n' || b == kEndOfOutput) : b == '"';
  if (closes) {
    if (f.count < min_length || (regex && !regex_accepts(*regex, f.bits))) return Step::dead;
    return raw ? Step::pop_retry : Step::pop_consumed;
  }
  if (b == kEndOfOutput || b < 0x20 || b == 0x7f || (raw && b == '<')) return Step::dead;
  if (max_length >= 0 && f.count >= max_length) return Step::dead;
  if (b == '\\' && !raw) {
    if (regex) return Step::dead;
    return f.stage = kStrEscape, Step::consumed;
  }
  if (regex) {
    f.bits = regex_step(*regex, f.bits, uint8_t(b));
    if (!f.bits) return Step::dead;
    // The pattern goes on from here, but maybe not with minLength and maxLength also met: then
    // this byte leads nowhere (string_bytes would count no way to finish).
    const int32_t rest = regex_distance(*regex, f.bits, min_length - (f.count + 1));
    if (rest == INT32_MAX || (max_length >= 0 && f.count + 1 + rest > max_length)) return Step::dead;
  } else if (b >= 0x80) {
    if (b >= 0xc2 && b <= 0xdf) f.utf8_left = 1;
    else if (b >= 0xe0 && b <= 0xef) f.utf8_left = 2;
    else if (b >= 0xf0 && b <= 0xf4) f.utf8_left = 3;
    else return Step::dead;
  }
  ++f.count;
  return Step::consumed;
}

bool GrammarMatcher::key_allowed(const Frame& f, const GrammarNode& n, int32_t p) const {
  if (f.bits >> p & 1) return false;
  if (n.properties[p].node < 0) return !(n.required_bits & ~f.bits);  // Coder end: all required given
  if (n.ordered)
    for (int32_t q = 0; q < p; ++q)
      if (!(f.bits >> q & 1)) return false;
  return true;
}

// An object key: the listed names still matching (key_order[lo, hi)) and, when additional
// properties are allowed, a free string.
GrammarMatcher::Step GrammarMatcher::key_byte(Thread& t, Frame& f, const GrammarNode& n, int b) {
  int32_t lo = f.lo, hi = f.hi;
  while (lo < hi) {
    const std::string& key = n.properties[n.key_order[lo]].key;
    if (int32_t(key.size()) > f.pos && uint8_t(key[f.pos]) == b) break;
    ++lo;
  }
  hi = lo;
  while (hi < f.hi) {
    const std::string& key = n.properties[n.key_order[hi]].key;
    if (!(int32_t(key.size()) > f.pos && uint8_t(key[f.pos]) == b)) break;
    ++hi;
  }
  // A listed key is complete: it is the property, and it may not be a duplicate.
  if (lo < hi && int32_t(n.properties[n.key_order[lo]].key.size()) == f.pos + 1) {
    const int32_t p = n.key_order[lo];
    if (!key_allowed(f, n, p)) return Step::dead;
    f.bits |= uint64_t(1) << p;
    f.pos = 0;
    if (n.properties[p].node < 0) return Step::pop_consumed;  // Coder "</function>"
    if (n.coder) {
      f.stage = kParamClose;
      return push(t, n.properties[p].node) ? Step::consumed : Step::dead;
    }
    f.stage = kObjectColon, f.hi = n.properties[p].node;
    return Step::consumed;
  }
  if (f.free_key) {
    Frame free = f;
    free.stage = kStr;
    Step s = string_byte(free, n, b, true);
    if (s == Step::pop_consumed) {  // the closing quote of an additional property's name
      f.stage = kObjectColon, f.hi = n.additional, f.pos = 0;
      return Step::consumed;
    }
    if (s == Step::consumed && free.stage == kStr) {
      f.count = free.count, f.utf8_left = free.utf8_left;
    } else {
      f.free_key = 0;  // an escape: not supported in additional names
    }
  }
  // A name that may no longer come (a duplicate, or Coder's end before a required parameter)
  // is no way forward: without another, the byte is refused now, not when the name completes.
  bool allowed = false;
  for (int32_t i = lo; i < hi && !allowed; ++i) allowed = key_allowed(f, n, n.key_order[i]);
  f.lo = lo, f.hi = hi, ++f.pos;
  return allowed || f.free_key ? Step::consumed : Step::dead;
}

GrammarMatcher::Step GrammarMatcher::literal_byte(Frame& f, const GrammarNode& n, int b) {
  const auto& lits = n.literals;
  int32_t lo = f.lo;
  while (lo < f.hi && !(int32_t(lits[lo].size()) > f.pos && uint8_t(lits[lo][f.pos]) == b)) ++lo;
  int32_t hi = lo;
  while (hi < f.hi && int32_t(lits[hi].size()) > f.pos && uint8_t(lits[hi][f.pos]) == b) ++hi;
  if (lo == hi) return int32_t(lits[f.lo].size()) == f.pos ? Step::pop_retry : Step::dead;
  f.lo = lo, f.hi = hi, ++f.pos;
  return hi - lo == 1 && int32_t(lits[lo].size()) == f.pos ? Step::pop_consumed : Step::consumed;
}

int64_t GrammarMatcher::min_bytes() const {
  int64_t best = kFar;
  for (int i = 0; i < threads_; ++i) best = std::min(best, thread_bytes(thread_[i]));
  return best;
}

int64_t GrammarMatcher::thread_bytes(const Thread& t) const {
  int64_t total = 0;
  for (int i = 0; i < t.depth; ++i) total = plus(total, frame_bytes(t.frames[i]));
  return total;
}

int64_t GrammarMatcher::string_bytes(const Frame& f, const GrammarNode& n, bool key) const {
  int64_t chars = key ? 0 : std::max<int64_t>(0, n.min_length - f.count);
  if (f.stage != kStr) chars = std::max<int64_t>(0, chars - 1);  // the escape makes a character
  if (!key && n.regex >= 0) {
    chars = regex_distance(g_->regexes[n.regex], f.bits, n.min_length - f.count);
    if (chars == INT32_MAX || (n.max_length >= 0 && f.count + chars > n.max_length)) return kFar;  // no way to finish
  }
  int64_t escape = f.stage == kStrEscape ? 1 : f.stage == kStrHex ? 4 - f.pos : 0;
  return escape + f.utf8_left + chars + (!key && n.raw ? 0 : 1);
}

// Bytes of the required properties not yet given, each with its key and separator, except one.
int64_t GrammarMatcher::missing_bytes(const Frame& f, const GrammarNode& n, int32_t except) const {
  int64_t total = 0;
  for (uint64_t m = n.required_bits & ~f.bits; m; m &= m - 1) {
    int32_t p = std::countr_zero(m);
    if (p == except) continue;
    total = plus(total, int64_t(n.properties[p].key.size()) + g_->nodes[n.properties[p].node].min_bytes +
                            (n.coder ? int64_t(kCoderClose.size()) : 2));  // JSON: ':' and ','
  }
  return total;
}

int64_t GrammarMatcher::frame_bytes(const Frame& f) const {
  const GrammarNode& n = g_->nodes[f.node];
  const int64_t item = n.items >= 0 ? g_->nodes[n.items].min_bytes : 0;
  const int missing = std::popcount(n.required_bits & ~f.bits);
  switch (f.stage) {
    case kStart: return n.min_bytes;
    case kStr: case kStrEscape: case kStrHex: return string_bytes(f, n, false);
    case kNumMinus: case kNumZero: case kNumInt: {
      const int digits = n.bounded ? digits_to_bounds(f, n) : f.stage == kNumMinus;
      return digits < 0 ? kFar : digits;
    }
    case kNumDot: return 1;
    case kNumFrac: return 0;
    case kWord: return int64_t(std::strlen(kWords[f.lo])) - f.pos;
    case kArrayOpen: return n.min_items == 0 ? 1 : n.min_items * (item + 1);
    case kArrayAfter: return std::max(0, n.min_items - f.count) * (item + 1) + 1;
    case kArrayComma: case kArraySpace: return item + std::max(0, n.min_items - f.count - 1) * (item + 1) + 1;
    case kObjectOpen: return missing == 0 ? 1 : missing_bytes(f, n, -1);  // the last ',' is the '}'
    case kObjectAfter: return missing_bytes(f, n, -1) + 1;
    case kObjectComma: case kObjectCommaSpace: {
      if (missing > 0) return missing_bytes(f, n, -1);
      int64_t best = n.additional >= 0 ? 3 + g_->nodes[n.additional].min_bytes : kFar;
      for (size_t p = 0; p < n.properties.size(); ++p)
        if (key_allowed(f, n, int32_t(p)))
          best = std::min(best, int64_t(n.properties[p].key.size()) + 1 + g_->nodes[n.properties[p].node].min_bytes);
      return plus(best, 1);
    }
    case kObjectColon: return 1 + g_->nodes[f.hi].min_bytes + missing_bytes(f, n, -1) + 1;
    case kObjectSpace: case kObjectValue: return g_->nodes[f.hi].min_bytes + missing_bytes(f, n, -1) + 1;
    case kParamClose: return int64_t(kCoderClose.size()) - f.pos + missing_bytes(f, n, -1) + int64_t(kCoderEnd.size());
    case kObjectKey: {
      int64_t best = kFar;
      for (int32_t i = f.lo; i < f.hi; ++i) {
        int32_t p = n.key_order[i];
        if (!key_allowed(f, n, p)) continue;
        const Property& prop = n.properties[p];
        int64_t rest = int64_t(prop.key.size()) - f.pos;
        if (prop.node < 0) {
          best = std::min(best, rest);
        } else if (n.coder) {
          best = std::min(best, rest + g_->nodes[prop.node].min_bytes + int64_t(kCoderClose.size()) +
                                    missing_bytes(f, n, p) + int64_t(kCoderEnd.size()));
        } else {
          best = std::min(best, rest + 1 + g_->nodes[prop.node].min_bytes + missing_bytes(f, n, p) + 1);
        }
      }
      if (f.free_key)
        best = std::min(best, f.utf8_left + 2 + g_->nodes[n.additional].min_bytes + missing_bytes(f, n, -1) + 1);
      return best;
    }
    case kLiteral: {
      int64_t best = kFar;
      for (int32_t i = f.lo; i < f.hi; ++i) best = std::min(best, int64_t(n.literals[i].size()) - f.pos);
      return best;
    }
    case kSequence: {
      int64_t total = 0;
      for (size_t i = size_t(f.pos); i < n.children.size(); ++i) total = plus(total, g_->nodes[n.children[i]].min_bytes);
      return total;
    }
    case kRepeatAfter: case kRepeatSeparator: {
      const int64_t each = g_->nodes[n.children[0]].min_bytes + g_->nodes[n.children[1]].min_bytes;
      if (f.stage == kRepeatAfter) return std::max(0, n.min_count - f.count) * each;
      return g_->nodes[n.children[0]].min_bytes + std::max(0, n.min_count - f.count - 1) * each;
    }
  }
  return kFar;
}

bool GrammarMatcher::string_top(StringTop& out) const {
  if (threads_ != 1 || thread_[0].depth == 0) return false;
  const Thread& t = thread_[0];
  const Frame& f = t.frames[t.depth - 1];
  const GrammarNode& n = g_->nodes[f.node];
  if (f.utf8_left != 0) return false;
  if (f.stage == kStr && n.regex < 0) {
    out.raw = n.raw;
    out.min_length = n.min_length;
    out.max_length = n.max_length;
  } else if (f.stage == kObjectKey && f.free_key && f.lo == f.hi && !n.coder) {
    out.raw = false;
    out.min_length = 0;
    out.max_length = -1;
  } else {
    return false;
  }
  out.count = f.count;
  out.rest_bytes = thread_bytes(t) - frame_bytes(f);
  if (f.stage == kObjectKey)  // what follows the name: ':' the value, the missing properties, '}'
    out.rest_bytes += 1 + g_->nodes[n.additional].min_bytes + missing_bytes(f, n, -1) + 1;
  return true;
}

void GrammarMatcher::add_string_chars(int32_t chars) {
  thread_[0].frames[thread_[0].depth - 1].count += chars;
}

}  // namespace ellm

namespace ellm {

bool GrammarMatcher::listed_or_free_key() const {
  if (threads_ != 1 || thread_[0].depth == 0) return false;
  const Frame& f = thread_[0].frames[thread_[0].depth - 1];
  return f.stage == kObjectKey && f.free_key && f.lo < f.hi && f.utf8_left == 0 && !g_->nodes[f.node].coder;
}

void GrammarMatcher::drop_listed_keys() {
  Frame& f = thread_[0].frames[thread_[0].depth - 1];
  f.lo = f.hi;
}

std::vector<std::string_view>& GrammarMatcher::listed_keys(std::vector<std::string_view>& out) const {
  out.clear();
  const Frame& f = thread_[0].frames[thread_[0].depth - 1];
  const GrammarNode& n = g_->nodes[f.node];
  for (int32_t i = f.lo; i < f.hi; ++i) out.push_back(std::string_view(n.properties[n.key_order[i]].key).substr(f.pos));
  return out;
}

}  // namespace ellm
