// The JSON Schema `pattern` subset (engine/json_schema.h) compiled to a Glushkov automaton:
// every character class of the pattern is one position, and a state is a bit set of positions,
// so a step is a few ANDs and ORs and an automaton of 63 positions needs no allocation to run.
#include <algorithm>
#include <bit>
#include <climits>

#include "grammar/json_schema.h"

namespace ellm {

namespace {

using ByteClass = std::array<uint64_t, 2>;

// What a generated pattern string may hold: printable ASCII without the two bytes JSON escapes.
ByteClass generatable() {
  ByteClass c{0, 0};
  for (int b = 0x20; b < 0x7f; ++b)
    if (b != '"' && b != '\\') c[b >> 6] |= uint64_t(1) << (b & 63);
  return c;
}

void add(ByteClass& c, int b) { c[b >> 6] |= uint64_t(1) << (b & 63); }
void add_range(ByteClass& c, int from, int to) {
  for (int b = from; b <= to; ++b) add(c, b);
}
ByteClass complement(const ByteClass& c) {
  ByteClass all = generatable();
  return {all[0] & ~c[0], all[1] & ~c[1]};
}

struct Ast {
  enum Kind { byte_class, concat, alternation, repeat } kind = concat;
  ByteClass bytes{0, 0};
  std::vector<Ast> children;
  int min = 1, max = 1;  // repeat; max -1 = unbounded
};

[[noreturn]] void bad(const std::string& what) { throw SchemaError("pattern", "pattern: " + what); }
// A valid pattern this compiler cannot enforce (strict: false then ignores it).
[[noreturn]] void unsupported(const std::string& what) { throw SchemaError("pattern", "pattern: " + what, true); }

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {
    if (!s_.empty() && s_.front() == '^') s_.erase(0, 1);
    if (!s_.empty() && s_.back() == '$' && (s_.size() < 2 || s_[s_.size() - 2] != '\\')) s_.pop_back();
  }
  Ast parse() {
    Ast ast = alternation(0);
    if (i_ != s_.size()) bad("unbalanced ')'");
    return ast;
  }

 private:
  Ast alternation(int depth) {
    if (depth > 32) unsupported("nested too deeply");
    Ast alt{Ast::alternation};
    alt.children.push_back(concat(depth));
    while (i_ < s_.size() && s_[i_] == '|') {
      ++i_;
      alt.children.push_back(concat(depth));
    }
    return alt.children.size() == 1 ? std::move(alt.children[0]) : alt;
  }
  Ast concat(int depth) {
    Ast cat{Ast::concat};
    while (i_ < s_.size() && s_[i_] != '|' && s_[i_] != ')') cat.children.push_back(quantified(atom(depth)));
    return cat;
  }
  Ast quantified(Ast atom) {
    while (i_ < s_.size()) {
      int min, max;
      char c = s_[i_];
      if (c == '*') min = 0, max = -1, ++i_;
      else if (c == '+') min = 1, max = -1, ++i_;
      else if (c == '?') min = 0, max = 1, ++i_;
      else if (c == '{') {
        ++i_;
        min = number();
        max = min;
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          max = i_ < s_.size() && s_[i_] == '}' ? -1 : number();
        }
        if (i_ >= s_.size() || s_[i_] != '}') bad("a '{' quantifier needs '}'");
        ++i_;
        if (max >= 0 && max < min) bad("a quantifier {m,n} needs m <= n");
      } else {
        break;
      }
      if (i_ < s_.size() && s_[i_] == '?') ++i_;  // lazy: the same strings match the whole pattern
      Ast rep{Ast::repeat};
      rep.min = min;
      rep.max = max;
      rep.children.push_back(std::move(atom));
      atom = std::move(rep);
    }
    return atom;
  }
  int number() {
    int n = 0, digits = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9' && digits < 4) n = n * 10 + (s_[i_++] - '0'), ++digits;
    if (digits == 0) bad("a quantifier needs a number");
    return n;
  }
  Ast atom(int depth) {
    char c = s_[i_++];
    Ast a{Ast::byte_class};
    if (c == '(') {
      if (s_.compare(i_, 2, "?:") == 0) i_ += 2;
      else if (i_ < s_.size() && s_[i_] == '?') unsupported("lookaround and named groups are not supported");
      Ast inner = alternation(depth + 1);
      if (i_ >= s_.size() || s_[i_] != ')') bad("unbalanced '('");
      ++i_;
      return inner;
    }
    if (c == '[') return char_class();
    if (c == '.') return a.bytes = generatable(), a;
    if (c == '\\') return a.bytes = escape(false), a;
    if (c == '*' || c == '+' || c == '?' || c == '{') bad("a quantifier follows nothing");
    if (c == '^' || c == '$') unsupported("'^' and '$' are supported only at the ends");
    if (uint8_t(c) >= 0x80 || uint8_t(c) < 0x20) unsupported("only printable ASCII is supported");
    add(a.bytes, uint8_t(c));
    return a;
  }
  ByteClass escape(bool in_class) {
    if (i_ >= s_.size()) bad("a trailing '\\'");
    char c = s_[i_++];
    ByteClass out{0, 0};
    switch (c) {
      case 'd': add_range(out, '0', '9'); return out;
      case 'D': add_range(out, '0', '9'); return complement(out);
      case 'w': add_range(out, 'a', 'z'), add_range(out, 'A', 'Z'), add_range(out, '0', '9'), add(out, '_'); return out;
      case 'W': add_range(out, 'a', 'z'), add_range(out, 'A', 'Z'), add_range(out, '0', '9'), add(out, '_'); return complement(out);
      case 's': add(out, ' '); return out;
      case 'S': add(out, ' '); return complement(out);
      default: break;
    }
    bool punct = (c >= 0x21 && c <= 0x2f) || (c >= 0x3a && c <= 0x40) || (c >= 0x5b && c <= 0x60) || (c >= 0x7b && c <= 0x7e);
    if (!punct && !(in_class && c == ' ')) unsupported(std::string("the escape '\\") + c + "' is not supported");
    add(out, uint8_t(c));
    return out;
  }
  Ast char_class() {
    Ast a{Ast::byte_class};
    bool negate = i_ < s_.size() && s_[i_] == '^';
    if (negate) ++i_;
    bool first = true;
    while (i_ < s_.size() && (s_[i_] != ']' || first)) {
      first = false;
      ByteClass one{0, 0};
      int from = -1;
      if (s_[i_] == '\\') {
        ++i_;
        one = escape(true);
        if (std::popcount(one[0]) + std::popcount(one[1]) == 1) from = one[0] ? std::countr_zero(one[0]) : 64 + std::countr_zero(one[1]);
      } else {
        from = uint8_t(s_[i_++]);
        if (from >= 0x80 || from < 0x20) unsupported("only printable ASCII is supported");
        add(one, from);
      }
      if (from >= 0 && i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
        ++i_;
        int to = uint8_t(s_[i_++]);
        if (to == '\\') {
          if (i_ >= s_.size()) bad("a trailing '\\'");
          to = uint8_t(s_[i_++]);
        }
        if (to < from) bad("a bad range in a class");
        if (to >= 0x80) unsupported("only printable ASCII is supported");
        add_range(one, from, to);
      }
      a.bytes[0] |= one[0];
      a.bytes[1] |= one[1];
    }
    if (i_ >= s_.size()) bad("unbalanced '['");
    ++i_;
    ByteClass all = generatable();
    a.bytes = negate ? complement(a.bytes) : ByteClass{a.bytes[0] & all[0], a.bytes[1] & all[1]};
    return a;
  }

  std::string s_;
  size_t i_ = 0;
};

struct Glushkov {
  uint64_t first = 0, last = 0;
  bool nullable = true;
};

class Builder {
 public:
  explicit Builder(Regex& regex) : r_(regex) {}
  Glushkov build(const Ast& ast) {
    switch (ast.kind) {
      case Ast::byte_class: {
        if (r_.class_bits.size() >= 63) unsupported("too complex (more than 63 positions)");
        uint64_t p = uint64_t(1) << r_.class_bits.size();
        // Only what a string can carry unescaped: a literal DEL or '"' is a position no output
        // reaches, so the distances (the budget logic) never count on it.
        const ByteClass all = generatable();
        r_.class_bits.push_back({ast.bytes[0] & all[0], ast.bytes[1] & all[1]});
        r_.follow.push_back(0);
        return {p, p, false};
      }
      case Ast::concat: {
        Glushkov all;
        for (const Ast& child : ast.children) all = then(all, build(child));
        return all;
      }
      case Ast::alternation: {
        Glushkov any{0, 0, false};
        for (const Ast& child : ast.children) {
          Glushkov g = build(child);
          any.first |= g.first, any.last |= g.last, any.nullable |= g.nullable;
        }
        return any;
      }
      case Ast::repeat: {
        Glushkov all;
        for (int i = 0; i < ast.min; ++i) all = then(all, build(ast.children[0]));
        if (ast.max < 0) {
          Glushkov loop = build(ast.children[0]);
          link(loop.last, loop.first);
          loop.nullable = true;
          return then(all, loop);
        }
        for (int i = ast.min; i < ast.max; ++i) {
          Glushkov optional = build(ast.children[0]);
          optional.nullable = true;
          all = then(all, optional);
        }
        return all;
      }
    }
    return {};
  }

 private:
  void link(uint64_t from, uint64_t to) {
    for (; from; from &= from - 1) r_.follow[std::countr_zero(from)] |= to;
  }
  Glushkov then(const Glushkov& a, const Glushkov& b) {
    link(a.last, b.first);
    return {a.first | (a.nullable ? b.first : 0), b.last | (b.nullable ? a.last : 0), a.nullable && b.nullable};
  }
  Regex& r_;
};

// A position with no byte left (masked away in the builder) is never entered: no distance.
bool enterable(const Regex& regex, size_t p) { return (regex.class_bits[p][0] | regex.class_bits[p][1]) != 0; }

int32_t min_distance(const Regex& regex, uint64_t positions, size_t row) {
  const int32_t* distance = regex.distance.data() + row * regex.class_bits.size();
  int32_t best = INT32_MAX;
  for (; positions; positions &= positions - 1) best = std::min(best, distance[std::countr_zero(positions)]);
  return best;
}

}  // namespace

Regex compile_regex(const std::string& pattern) {
  Regex regex;
  Glushkov g = Builder(regex).build(Parser(pattern).parse());
  regex.first = g.first;
  regex.last = g.last;
  regex.nullable = g.nullable;
  // Bytes from each position to an accepting one (Bellman-Ford over at most 63 positions).
  const size_t n = regex.class_bits.size();
  regex.distance.assign(n, INT32_MAX);
  for (size_t p = 0; p < n; ++p)
    if ((regex.last >> p & 1) && enterable(regex, p)) regex.distance[p] = 0;
  for (size_t round = 0; round < n; ++round)
    for (size_t p = 0; p < n; ++p) {
      if (!enterable(regex, p)) continue;
      uint64_t next = regex.follow[p];
      for (; next; next &= next - 1) {
        int q = std::countr_zero(next);
        if (enterable(regex, size_t(q)) && regex.distance[q] != INT32_MAX)
          regex.distance[p] = std::min(regex.distance[p], regex.distance[q] + 1);
      }
    }
  if (regex_distance(regex, kRegexStart) == INT32_MAX) unsupported("no string of printable ASCII matches it");
  return regex;
}

uint64_t regex_step(const Regex& regex, uint64_t state, uint8_t byte) {
  if (byte >= 0x80) return 0;
  uint64_t next = state & kRegexStart ? regex.first : 0;
  for (uint64_t p = state & ~kRegexStart; p; p &= p - 1) next |= regex.follow[std::countr_zero(p)];
  uint64_t out = 0;
  const int word = byte >> 6;
  const uint64_t bit = uint64_t(1) << (byte & 63);
  for (; next; next &= next - 1) {
    int p = std::countr_zero(next);
    if (regex.class_bits[p][word] & bit) out |= uint64_t(1) << p;
  }
  return out;
}

bool regex_accepts(const Regex& regex, uint64_t state) {
  return ((state & kRegexStart) && regex.nullable) || (state & regex.last);
}

void regex_require_length(Regex& regex, int32_t min_length) {
  const size_t n = regex.class_bits.size();
  const size_t rows = size_t(min_length) + 1;
  if (n == 0 || regex.distance.size() >= rows * n) return;
  size_t r = regex.distance.size() / n;
  regex.distance.resize(rows * n, INT32_MAX);
  // At least r bytes after p: one byte to a next position q, then at least r - 1 after q.
  for (; r < rows; ++r)
    for (size_t p = 0; p < n; ++p) {
      if (!enterable(regex, p)) continue;
      for (uint64_t next = regex.follow[p]; next; next &= next - 1) {
        const int q = std::countr_zero(next);
        const int32_t after = regex.distance[(r - 1) * n + size_t(q)];
        if (enterable(regex, size_t(q)) && after != INT32_MAX)
          regex.distance[r * n + p] = std::min(regex.distance[r * n + p], after + 1);
      }
    }
}

int32_t regex_distance(const Regex& regex, uint64_t state, int32_t at_least) {
  if (at_least <= 0 && regex_accepts(regex, state)) return 0;
  const size_t n = regex.class_bits.size();
  if (n == 0) return INT32_MAX;
  const int32_t last_row = int32_t(regex.distance.size() / n) - 1;
  auto row = [&](int32_t r) { return size_t(std::clamp(r, 0, last_row)); };
  int32_t best = min_distance(regex, state & ~kRegexStart, row(at_least));
  if (state & kRegexStart) {
    int32_t from_start = min_distance(regex, regex.first, row(at_least - 1));
    if (from_start != INT32_MAX) best = std::min(best, from_start + 1);
  }
  return best;
}

}  // namespace ellm
