#pragma once
// Jinja lexer: template text -> tokens, with Hugging Face's whitespace settings
// (trim_blocks, lstrip_blocks, keep_trailing_newline=False) and the `-`/`+` tag modifiers
// already applied to the text tokens, so the parser never sees layout rules.
#include <string>
#include <vector>

namespace ellm::jinja {

enum class Tok {
  Text,        // literal template text (value)
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,        // identifier or keyword (value)
  String,      // string literal, escapes resolved (value)
  Int,         // integer literal (value: digits, underscores removed)
  Float,       // float literal (value)
  Op,          // operator or punctuation (value: "+", "//", "(", ...)
  End,         // end of template
};

struct Token {
  Tok type;
  std::string value;
  int line;
};

// Throws ellm::Error("<name>:<line>: ...") on malformed input (unterminated tag, comment or
// string, unbalanced brackets, unexpected characters).
std::vector<Token> lex(const std::string& source, const std::string& name);

}  // namespace ellm::jinja
