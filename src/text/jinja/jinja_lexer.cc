#include "text/jinja/jinja_lexer.h"

#include <cstring>

#include "base/error.h"
#include "text/jinja/jinja_strings.h"

namespace ellm::jinja {
namespace {

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r'; }
bool is_ws(char c) { return is_blank(c) || c == '\n'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// Jinja reads templates with universal newlines and drops one trailing newline.
std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& name) : src_(normalize_newlines(source)), name_(name) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) lex_text_and_tag();
    tokens_.push_back({Tok::End, "", line_});
    return std::move(tokens_);
  }

 private:
  std::string src_;
  const std::string& name_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;  // the previous tag consumed a newline (or we are at the start)
  std::vector<Token> tokens_;

  [[noreturn]] void error(int line, const std::string& what) {
    throw Error(name_ + ":" + std::to_string(line) + ": " + what);
  }

  void emit(Tok type, std::string value, int line) { tokens_.push_back({type, std::move(value), line}); }

  void advance_to(size_t new_pos) {
    for (size_t i = pos_; i < new_pos; ++i) line_ += src_[i] == '\n';
    pos_ = new_pos;
  }

  // Text up to the next tag, then the tag.
  void lex_text_and_tag() {
    size_t tag = pos_;
    while (true) {
      tag = src_.find('{', tag);
      if (tag == std::string::npos || tag + 1 >= src_.size()) {
        tag = std::string::npos;
        break;
      }
      char c = src_[tag + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++tag;
    }
    if (tag == std::string::npos) {
      emit(Tok::Text, src_.substr(pos_), line_);
      advance_to(src_.size());
      return;
    }
    char kind = src_[tag + 1];
    char sign = tag + 2 < src_.size() ? src_[tag + 2] : 0;
    std::string text = src_.substr(pos_, tag - pos_);
    if (sign == '-') {
      size_t keep = text.size();
      while (keep > 0 && is_ws(text[keep - 1])) --keep;
      text.resize(keep);
    } else if (sign != '+' && kind != '{') {
      lstrip_block(text);
    }
    int text_line = line_;
    if (!text.empty()) emit(Tok::Text, std::move(text), text_line);
    advance_to(tag);
    size_t open_len = (sign == '-' || (sign == '+' && kind != '{')) ? 3 : 2;
    if (kind == '#') return lex_comment(open_len);
    if (kind == '%' && lex_raw(open_len)) return;
    lex_tag(kind, open_len);
  }

  // lstrip_blocks: spaces between the start of a line and a block tag are dropped.
  void lstrip_block(std::string& text) {
    size_t line_start = text.rfind('\n');
    line_start = line_start == std::string::npos ? 0 : line_start + 1;
    if (line_start == 0 && !line_starting_) return;
    if (line_start == text.size()) return;
    for (size_t i = line_start; i < text.size(); ++i)
      if (!is_blank(text[i])) return;
    text.resize(line_start);
  }

  // After a tag: `-` strips all following whitespace; else trim_blocks drops one newline.
  void after_tag(char sign, bool trim_newline) {
    size_t end = pos_;
    if (sign == '-') {
      while (end < src_.size() && is_ws(src_[end])) ++end;
    } else if (sign != '+' && trim_newline && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    line_starting_ = end > pos_ ? src_[end - 1] == '\n' : false;
    advance_to(end);
  }

  void lex_comment(size_t open_len) {
    int start_line = line_;
    size_t body = pos_ + open_len;
    size_t end = src_.find("#}", body);
    if (end == std::string::npos) error(start_line, "unterminated comment: missing '#}'");
    char sign = end > body && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    advance_to(end + 2);
    after_tag(sign, true);
  }

  // {% raw %} ... {% endraw %}: the text between is emitted verbatim.
  bool lex_raw(size_t open_len) {
    size_t p = pos_ + open_len;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    bool strip_after_open = src_.compare(p, 3, "-%}") == 0;
    if (!strip_after_open && src_.compare(p, 2, "%}") != 0) return false;
    int start_line = line_;
    p += strip_after_open ? 3 : 2;
    if (strip_after_open)
      while (p < src_.size() && is_ws(src_[p])) ++p;
    // Find the closing {% endraw %}.
    for (size_t close = src_.find("{%", p); close != std::string::npos; close = src_.find("{%", close + 2)) {
      size_t q = close + 2;
      char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q++] : 0;
      while (q < src_.size() && is_ws(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_ws(src_[q])) ++q;
      char end_sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q++] : 0;
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(p, close - p);
      if (sign == '-')
        while (!text.empty() && is_ws(text.back())) text.pop_back();
      advance_to(p);
      if (!text.empty()) emit(Tok::Text, std::move(text), line_);
      advance_to(q + 2);
      after_tag(end_sign, true);
      return true;
    }
    error(start_line, "unterminated 'raw' block: missing '{% endraw %}'");
  }

  // Inside {{ }} or {% %}: expression tokens until the closing delimiter at bracket depth 0.
  void lex_tag(char kind, size_t open_len) {
    int start_line = line_;
    bool block = kind == '%';
    emit(block ? Tok::BlockBegin : Tok::VarBegin, "", line_);
    advance_to(pos_ + open_len);
    std::string brackets;
    const char* close = block ? "%}" : "}}";
    while (true) {
      if (pos_ >= src_.size())
        error(start_line, std::string("unterminated tag: missing '") + close + "'");
      if (brackets.empty()) {
        char sign = src_[pos_];
        bool signed_close = (sign == '-' || (sign == '+' && block)) && src_.compare(pos_ + 1, 2, close) == 0;
        if (signed_close || src_.compare(pos_, 2, close) == 0) {
          emit(block ? Tok::BlockEnd : Tok::VarEnd, "", line_);
          advance_to(pos_ + (signed_close ? 3 : 2));
          after_tag(signed_close ? sign : 0, block);
          return;
        }
      }
      char c = src_[pos_];
      if (is_ws(c)) {
        advance_to(pos_ + 1);
      } else if (is_digit(c)) {
        lex_number();
      } else if (is_name_start(c)) {
        size_t end = pos_;
        while (end < src_.size() && is_name_char(src_[end])) ++end;
        emit(Tok::Name, src_.substr(pos_, end - pos_), line_);
        advance_to(end);
      } else if (c == '\'' || c == '"') {
        lex_string();
      } else {
        lex_operator(brackets);
      }
    }
  }

  void lex_number() {
    size_t p = pos_;
    auto digits = [&] {
      while (p < src_.size() && (is_digit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && is_digit(src_[p + 1])))) ++p;
    };
    bool is_float = false;
    if (src_[p] == '0' && p + 1 < src_.size() && std::strchr("xXoObB", src_[p + 1]) && src_[p + 1] != 0) {
      int base = (src_[p + 1] | 0x20) == 'x' ? 16 : (src_[p + 1] | 0x20) == 'o' ? 8 : 2;
      size_t q = p + 2;
      std::string value;
      while (q < src_.size() && (std::isxdigit(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) {
        if (src_[q] != '_') value += src_[q];
        ++q;
      }
      if (value.empty()) error(line_, "invalid integer literal");
      unsigned long long v = 0;
      for (char d : value) {
        int digit = is_digit(d) ? d - '0' : (d | 0x20) - 'a' + 10;
        if (digit >= base) error(line_, "invalid digit in integer literal");
        if (v > (~0ULL >> 8)) error(line_, "integer literal too large");
        v = v * unsigned(base) + unsigned(digit);
      }
      emit(Tok::Int, std::to_string(v), line_);
      advance_to(q);
      return;
    }
    digits();
    if (p + 1 < src_.size() && src_[p] == '.' && is_digit(src_[p + 1])) {
      ++p;
      digits();
      is_float = true;
    }
    if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        p = q;
        digits();
        is_float = true;
      }
    }
    std::string value;
    for (size_t i = pos_; i < p; ++i)
      if (src_[i] != '_') value += src_[i];
    emit(is_float ? Tok::Float : Tok::Int, value, line_);
    advance_to(p);
  }

  // Python string literal escapes (Jinja decodes literals with 'unicode-escape').
  void lex_string() {
    int start_line = line_;
    char quote = src_[pos_];
    size_t p = pos_ + 1;
    std::string value;
    while (true) {
      if (p >= src_.size()) error(start_line, "unterminated string literal");
      char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) error(start_line, "unterminated string literal");
      char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case '\n': break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t i = 0; i < n; ++i, ++p) {
            if (p >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[p])))
              error(start_line, std::string("truncated \\") + e + " escape in string literal");
            char d = src_[p];
            cp = cp * 16 + uint32_t(is_digit(d) ? d - '0' : (d | 0x20) - 'a' + 10);
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) error(start_line, "invalid code point in string literal");
          append_codepoint(cp, value);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = uint32_t(e - '0');
            for (int i = 0; i < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++i, ++p)
              cp = cp * 8 + uint32_t(src_[p] - '0');
            append_codepoint(cp, value);
          } else {
            value += '\\';
            value += e;
          }
      }
    }
    emit(Tok::String, std::move(value), start_line);
    advance_to(p + 1);
  }

  static void append_codepoint(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  void lex_operator(std::string& brackets) {
    static const char* const kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwo) {
      if (src_.compare(pos_, 2, op) == 0) {
        emit(Tok::Op, op, line_);
        advance_to(pos_ + 2);
        return;
      }
    }
    char c = src_[pos_];
    if (!std::strchr("+-/*%~[](){}<>=.:|,;", c)) {
      std::string shown = (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
                              ? "\\x" + std::string(1, "0123456789abcdef"[(c >> 4) & 15]) + "0123456789abcdef"[c & 15]
                              : std::string(1, c);
      error(line_, "unexpected character '" + shown + "'");
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets += c;
    } else if (c == ')' || c == ']' || c == '}') {
      char open = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (brackets.empty() || brackets.back() != open) error(line_, std::string("unexpected '") + c + "'");
      brackets.pop_back();
    }
    emit(Tok::Op, std::string(1, c), line_);
    advance_to(pos_ + 1);
  }
};

}  // namespace

std::vector<Token> lex(const std::string& source, const std::string& name) {
  return Lexer(source, name).run();
}

}  // namespace ellm::jinja
