#pragma once
// The Jinja parser's state and token helpers, shared by its two halves: statements
// (jinja_parser.cc) and expressions (jinja_parser_expr.cc, after jinja2/parser.py, same names
// and precedence). Only those two files include this header; others call parse()
// (jinja_parser.h).
#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "text/jinja/jinja_ast.h"
#include "text/jinja/jinja_lexer.h"

namespace ellm::jinja {

constexpr int kMaxNesting = 100;  // expressions and blocks; real templates nest < 10

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& name) : tokens_(tokens), name_(name) {}

  Body parse_template() {
    Body body = subparse({});
    return body;
  }

 private:
  const std::vector<Token>& tokens_;
  const std::string& name_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // for break/continue
  std::vector<std::string> open_blocks_;

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting) p.error("template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  // ---- token helpers ----
  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  void next() {
    if (cur().type != Tok::End) ++pos_;
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().value == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  [[noreturn]] void error(const std::string& what, int line = -1) const {
    throw Error(name_ + ":" + std::to_string(line < 0 ? cur().line : line) + ": " + what);
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Text: return "template text";
      case Tok::VarBegin: return "'{{'";
      case Tok::VarEnd: return "end of print statement '}}'";
      case Tok::BlockBegin: return "'{%'";
      case Tok::BlockEnd: return "end of statement block '%}'";
      case Tok::End: return "end of template";
      case Tok::String: return "string literal";
      default: return "'" + t.value + "'";
    }
  }

  void expect_op(const char* op) {
    if (!skip_op(op)) error(std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) error("expected a name, got " + describe(cur()));
    std::string n = cur().value;
    next();
    return n;
  }
  void expect(Tok type) {
    if (cur().type != type) error("expected " + describe(Token{type, "", 0}) + ", got " + describe(cur()));
    next();
  }

  static ExprPtr node(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  static StmtPtr stmt(Stmt::Kind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  // ---- statements (jinja_parser.cc) ----
  Body subparse(std::initializer_list<const char*> end_tags);
  StmtPtr parse_statement();
  void end_tag(const char* tag) {  // cursor on the end tag's name
    next();
    expect(Tok::BlockEnd);
    (void)tag;
  }
  StmtPtr parse_if(int line);
  StmtPtr parse_for(int line);
  ExprPtr parse_assign_target(const char* end_name = nullptr, bool with_namespace = false);
  StmtPtr parse_set(int line);
  void parse_params(std::vector<MacroParam>& params);
  StmtPtr parse_macro(int line);
  StmtPtr parse_call_block(int line);
  StmtPtr parse_filter_block(int line);
  StmtPtr parse_with(int line);
  StmtPtr parse_generation(int line);

  // ---- expressions (jinja_parser_expr.cc) ----
  bool at_tuple_end(const char* extra_end) const;
  ExprPtr parse_tuple(bool with_condexpr = true, const char* extra_end = nullptr, bool explicit_parens = false);
  ExprPtr parse_expression() { return parse_condexpr(); }
  ExprPtr parse_condexpr();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr binary(const std::string& op, ExprPtr left, ExprPtr right, int line);
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter = true);
  ExprPtr literal(Value v, int line);
  ExprPtr parse_primary();
  ExprPtr parse_list();
  ExprPtr parse_dict();
  ExprPtr parse_postfix(ExprPtr n);
  ExprPtr parse_filter_expr(ExprPtr n);
  ExprPtr parse_subscript(ExprPtr object);
  ExprPtr parse_subscribed();
  void parse_call_args(Expr& call);
  ExprPtr parse_call(ExprPtr callee);
  std::string dotted_name();
  ExprPtr parse_filter(ExprPtr object, bool start_inline = false);
  ExprPtr parse_test(ExprPtr object);
};

}  // namespace ellm::jinja
