#include "text/jinja/jinja_parser.h"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>

#include "base/error.h"

namespace ellm::jinja {
namespace {

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

  // ---- statements ----

  // Parses until a block tag named in `end_tags`; leaves the cursor on that tag's name.
  Body subparse(std::initializer_list<const char*> end_tags) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::End) {
        if (end_tags.size() == 0) return body;
        std::string expected;
        for (const char* tag : end_tags) expected += (expected.empty() ? "'" : " or '") + std::string(tag) + "'";
        error("unexpected end of template: '" + open_blocks_.back() + "' block needs " + expected);
      }
      if (t.type == Tok::Text) {
        auto s = stmt(Stmt::Kind::Text, t.line);
        s->text = t.value;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::VarBegin) {
        auto s = stmt(Stmt::Kind::Output, t.line);
        next();
        s->expr = parse_tuple();
        expect(Tok::VarEnd);
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        next();
        if (cur().type != Tok::Name) error("expected a tag name after '{%', got " + describe(cur()));
        for (const char* tag : end_tags)
          if (cur().value == tag) return body;
        body.push_back(parse_statement());
      } else {
        error("unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    DepthGuard guard(*this);
    const std::string tag = cur().value;
    int line = cur().line;
    next();
    open_blocks_.push_back(tag);
    StmtPtr s;
    if (tag == "if") s = parse_if(line);
    else if (tag == "for") s = parse_for(line);
    else if (tag == "set") s = parse_set(line);
    else if (tag == "macro") s = parse_macro(line);
    else if (tag == "call") s = parse_call_block(line);
    else if (tag == "filter") s = parse_filter_block(line);
    else if (tag == "with") s = parse_with(line);
    else if (tag == "generation") s = parse_generation(line);
    else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) error("'" + tag + "' outside of a loop", line);
      s = stmt(tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, line);
      expect(Tok::BlockEnd);
    } else if (tag.rfind("end", 0) == 0 || tag == "else" || tag == "elif") {
      error("unexpected '" + tag + "' tag", line);
    } else {
      error("unknown tag '" + tag + "'", line);
    }
    open_blocks_.pop_back();
    return s;
  }

  void end_tag(const char* tag) {  // cursor on the end tag's name
    next();
    expect(Tok::BlockEnd);
    (void)tag;
  }

  StmtPtr parse_if(int line) {
    auto s = stmt(Stmt::Kind::If, line);
    s->expr = parse_tuple(false);
    expect(Tok::BlockEnd);
    s->body = subparse({"elif", "else", "endif"});
    if (is_name("elif")) {
      int elif_line = cur().line;
      next();
      s->orelse.push_back(parse_if(elif_line));  // consumes through endif
      return s;
    }
    if (is_name("else")) {
      next();
      expect(Tok::BlockEnd);
      s->orelse = subparse({"endif"});
    }
    end_tag("endif");
    return s;
  }

  StmtPtr parse_for(int line) {
    auto s = stmt(Stmt::Kind::For, line);
    s->target = parse_assign_target("in");
    if (!skip_name("in")) error("expected 'in' in for loop, got " + describe(cur()));
    s->expr = parse_tuple(false, "recursive");
    if (skip_name("if")) s->cond = parse_expression();
    if (is_name("recursive")) error("recursive for loops are not supported");
    expect(Tok::BlockEnd);
    ++loop_depth_;
    s->body = subparse({"endfor", "else"});
    --loop_depth_;
    if (is_name("else")) {
      next();
      expect(Tok::BlockEnd);
      s->orelse = subparse({"endfor"});
    }
    end_tag("endfor");
    return s;
  }

  // `name`, `a, b`, `(a, b)` or (with_namespace) `ns.attr`.
  ExprPtr parse_assign_target(const char* end_name = nullptr, bool with_namespace = false) {
    int line = cur().line;
    if (with_namespace && cur().type == Tok::Name && peek().type == Tok::Op && peek().value == ".") {
      auto ns = node(Expr::Kind::Name, line);
      ns->name = expect_name();
      next();  // '.'
      auto attr = node(Expr::Kind::Attr, line);
      attr->object = std::move(ns);
      attr->name = expect_name();
      return attr;
    }
    bool parens = skip_op("(");
    auto tuple = node(Expr::Kind::Tuple, line);
    do {
      if (parens && is_op(")")) break;
      if (end_name && is_name(end_name)) break;
      auto n = node(Expr::Kind::Name, cur().line);
      n->name = expect_name();
      if (n->name == "true" || n->name == "false" || n->name == "none" || n->name == "True" ||
          n->name == "False" || n->name == "None")
        error("cannot assign to '" + n->name + "'");
      tuple->items.push_back(std::move(n));
    } while (skip_op(","));
    if (parens) expect_op(")");
    if (tuple->items.empty()) error("expected a name to assign to");
    if (tuple->items.size() == 1 && !parens) return std::move(tuple->items[0]);
    return tuple;
  }

  StmtPtr parse_set(int line) {
    ExprPtr target = parse_assign_target(nullptr, true);
    if (skip_op("=")) {
      auto s = stmt(Stmt::Kind::Set, line);
      s->target = std::move(target);
      s->expr = parse_tuple();
      expect(Tok::BlockEnd);
      return s;
    }
    if (target->kind != Expr::Kind::Name) error("block 'set' needs a single name", line);
    auto s = stmt(Stmt::Kind::SetBlock, line);
    s->name = target->name;
    if (is_op("|")) s->filter = parse_filter(nullptr);
    expect(Tok::BlockEnd);
    s->body = subparse({"endset"});
    end_tag("endset");
    return s;
  }

  void parse_params(std::vector<MacroParam>& params) {
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam p;
      p.name = expect_name();
      if (skip_op("=")) p.default_value = parse_expression();
      params.push_back(std::move(p));
    }
    next();
  }

  StmtPtr parse_macro(int line) {
    auto s = stmt(Stmt::Kind::Macro, line);
    s->name = expect_name();
    parse_params(s->params);
    expect(Tok::BlockEnd);
    int saved_loops = loop_depth_;
    loop_depth_ = 0;
    s->body = subparse({"endmacro"});
    loop_depth_ = saved_loops;
    end_tag("endmacro");
    return s;
  }

  StmtPtr parse_call_block(int line) {
    auto s = stmt(Stmt::Kind::CallBlock, line);
    if (is_op("(")) parse_params(s->params);
    s->expr = parse_expression();
    if (s->expr->kind != Expr::Kind::Call) error("'call' block needs a macro call", line);
    expect(Tok::BlockEnd);
    s->body = subparse({"endcall"});
    end_tag("endcall");
    return s;
  }

  StmtPtr parse_filter_block(int line) {
    auto s = stmt(Stmt::Kind::FilterBlock, line);
    s->filter = parse_filter(nullptr, true);
    expect(Tok::BlockEnd);
    s->body = subparse({"endfilter"});
    end_tag("endfilter");
    return s;
  }

  StmtPtr parse_with(int line) {
    auto s = stmt(Stmt::Kind::Scope, line);
    while (cur().type != Tok::BlockEnd) {
      if (!s->assignments.empty()) expect_op(",");
      std::string name = expect_name();
      expect_op("=");
      s->assignments.emplace_back(name, parse_expression());
    }
    next();
    s->body = subparse({"endwith"});
    end_tag("endwith");
    return s;
  }

  // Hugging Face's {% generation %} marks assistant text for masks; it renders its body.
  StmtPtr parse_generation(int line) {
    auto s = stmt(Stmt::Kind::Scope, line);
    expect(Tok::BlockEnd);
    s->body = subparse({"endgeneration"});
    end_tag("endgeneration");
    return s;
  }

  // ---- expressions (jinja2/parser.py, same names and precedence) ----

  bool at_tuple_end(const char* extra_end) const {
    const Token& t = cur();
    if (t.type == Tok::VarEnd || t.type == Tok::BlockEnd || t.type == Tok::End) return true;
    if (t.type == Tok::Op && t.value == ")") return true;
    return extra_end && t.type == Tok::Name && t.value == extra_end;
  }

  ExprPtr parse_tuple(bool with_condexpr = true, const char* extra_end = nullptr, bool explicit_parens = false) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (at_tuple_end(extra_end)) break;
      items.push_back(with_condexpr ? parse_expression() : parse_or());
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) error("expected an expression, got " + describe(cur()));
    }
    auto t = node(Expr::Kind::Tuple, line);
    t->items = std::move(items);
    return t;
  }

  ExprPtr parse_expression() { return parse_condexpr(); }

  ExprPtr parse_condexpr() {
    DepthGuard guard(*this);
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      auto c = node(Expr::Kind::Cond, cur().line);
      next();
      c->cond = parse_or();
      if (skip_name("else")) c->otherwise = parse_condexpr();
      c->then = std::move(expr);
      expr = std::move(c);
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      auto n = node(Expr::Kind::Or, cur().line);
      next();
      n->left = std::move(left);
      n->right = parse_and();
      left = std::move(n);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      auto n = node(Expr::Kind::And, cur().line);
      next();
      n->left = std::move(left);
      n->right = parse_not();
      left = std::move(n);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      auto n = node(Expr::Kind::Unary, cur().line);
      n->name = "not";
      next();
      n->object = parse_not();
      return n;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr first = parse_math1();
    auto cmp = node(Expr::Kind::Compare, line);
    cmp->items.push_back(std::move(first));
    while (true) {
      std::string op;
      if (cur().type == Tok::Op && (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                                    cur().value == ">" || cur().value == "<=" || cur().value == ">=")) {
        op = cur().value;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == Tok::Name && peek().value == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    if (cmp->ops.empty()) return std::move(cmp->items[0]);
    return cmp;
  }

  ExprPtr binary(const std::string& op, ExprPtr left, ExprPtr right, int line) {
    auto n = node(Expr::Kind::Binary, line);
    n->name = op;
    n->left = std::move(left);
    n->right = std::move(right);
    return n;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().value;
      int line = cur().line;
      next();
      left = binary(op, std::move(left), parse_concat(), line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      int line = cur().line;
      next();
      left = binary("~", std::move(left), parse_math2(), line);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().value;
      int line = cur().line;
      next();
      left = binary(op, std::move(left), parse_pow(), line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary();
    while (is_op("**")) {
      int line = cur().line;
      next();
      left = binary("**", std::move(left), parse_unary(), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter = true) {
    DepthGuard guard(*this);
    ExprPtr n;
    if (is_op("-") || is_op("+")) {
      n = node(Expr::Kind::Unary, cur().line);
      n->name = cur().value;
      next();
      n->object = parse_unary(false);
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_expr(std::move(n));
    return n;
  }

  ExprPtr literal(Value v, int line) {
    auto n = node(Expr::Kind::Literal, line);
    n->literal = std::move(v);
    return n;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    switch (t.type) {
      case Tok::Name: {
        std::string n = t.value;
        next();
        if (n == "true" || n == "True") return literal(Value::from_bool(true), line);
        if (n == "false" || n == "False") return literal(Value::from_bool(false), line);
        if (n == "none" || n == "None") return literal(Value::none(), line);
        auto e = node(Expr::Kind::Name, line);
        e->name = n;
        return e;
      }
      case Tok::String: {
        std::string s;
        while (cur().type == Tok::String) {
          s += cur().value;
          next();
        }
        return literal(Value::from_string(std::move(s)), line);
      }
      case Tok::Int: {
        errno = 0;
        char* end = nullptr;
        long long v = std::strtoll(t.value.c_str(), &end, 10);
        if (errno == ERANGE) error("integer literal too large");
        next();
        return literal(Value::from_int(v), line);
      }
      case Tok::Float: {
        double v = std::strtod(t.value.c_str(), nullptr);
        next();
        return literal(Value::from_float(v), line);
      }
      case Tok::Op:
        if (t.value == "(") {
          next();
          ExprPtr e = parse_tuple(true, nullptr, true);
          expect_op(")");
          return e;
        }
        if (t.value == "[") return parse_list();
        if (t.value == "{") return parse_dict();
        break;
      default: break;
    }
    error("unexpected " + describe(t));
  }

  ExprPtr parse_list() {
    auto n = node(Expr::Kind::List, cur().line);
    expect_op("[");
    while (!is_op("]")) {
      if (!n->items.empty()) expect_op(",");
      if (is_op("]")) break;
      n->items.push_back(parse_expression());
    }
    next();
    return n;
  }

  ExprPtr parse_dict() {
    auto n = node(Expr::Kind::Dict, cur().line);
    expect_op("{");
    while (!is_op("}")) {
      if (!n->items.empty()) expect_op(",");
      if (is_op("}")) break;
      n->keys.push_back(parse_expression());
      expect_op(":");
      n->items.push_back(parse_expression());
    }
    next();
    return n;
  }

  ExprPtr parse_postfix(ExprPtr n) {
    while (true) {
      if (is_op(".") || is_op("[")) n = parse_subscript(std::move(n));
      else if (is_op("(")) n = parse_call(std::move(n));
      else return n;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr n) {
    while (true) {
      if (is_op("|")) n = parse_filter(std::move(n));
      else if (is_name("is")) n = parse_test(std::move(n));
      else if (is_op("(")) n = parse_call(std::move(n));
      else return n;
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {
    int line = cur().line;
    if (skip_op(".")) {
      if (cur().type == Tok::Name) {
        auto n = node(Expr::Kind::Attr, line);
        n->object = std::move(object);
        n->name = cur().value;
        next();
        return n;
      }
      if (cur().type == Tok::Int) {
        auto n = node(Expr::Kind::Item, line);
        n->object = std::move(object);
        n->right = literal(Value::from_int(std::strtoll(cur().value.c_str(), nullptr, 10)), line);
        next();
        return n;
      }
      error("expected an attribute name after '.', got " + describe(cur()));
    }
    expect_op("[");
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    next();
    if (args.empty()) error("empty subscript", line);
    ExprPtr index;
    if (args.size() == 1) {
      index = std::move(args[0]);
    } else {
      for (const ExprPtr& arg : args)
        if (arg->kind == Expr::Kind::Slice) error("a slice cannot be part of a tuple subscript", line);
      index = node(Expr::Kind::Tuple, line);
      index->items = std::move(args);
    }
    if (index->kind == Expr::Kind::Slice) {
      index->object = std::move(object);
      return index;
    }
    auto n = node(Expr::Kind::Item, line);
    n->object = std::move(object);
    n->right = std::move(index);
    return n;
  }

  ExprPtr parse_subscribed() {
    int line = cur().line;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression();
      if (!is_op(":")) return start;
    }
    next();  // ':'
    auto s = node(Expr::Kind::Slice, line);
    s->start = std::move(start);
    if (!is_op(":") && !is_op("]") && !is_op(",")) s->stop = parse_expression();
    if (skip_op(":") && !is_op("]") && !is_op(",")) s->step = parse_expression();
    return s;
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (!call.items.empty() || !call.keywords.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) error("*args and **kwargs in calls are not supported");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().value == "=") {
        std::string key = cur().value;
        next();
        next();
        call.keywords.emplace_back(key, parse_expression());
      } else {
        if (!call.keywords.empty()) error("positional argument after keyword argument");
        call.items.push_back(parse_expression());
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto n = node(Expr::Kind::Call, cur().line);
    n->object = std::move(callee);
    parse_call_args(*n);
    return n;
  }

  std::string dotted_name() {
    std::string n = expect_name();
    while (is_op(".")) {
      next();
      n += "." + expect_name();
    }
    return n;
  }

  // `| name(args)` chain; with start_inline the first filter has no leading '|'.
  ExprPtr parse_filter(ExprPtr object, bool start_inline = false) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      auto n = node(Expr::Kind::Filter, cur().line);
      n->name = dotted_name();
      n->object = std::move(object);
      if (is_op("(")) parse_call_args(*n);
      object = std::move(n);
    }
    return object;
  }

  ExprPtr parse_test(ExprPtr object) {
    auto n = node(Expr::Kind::Test, cur().line);
    next();  // 'is'
    n->negated = skip_name("not");
    n->name = dotted_name();
    n->object = std::move(object);
    const Token& t = cur();
    if (is_op("(")) {
      parse_call_args(*n);
    } else if ((t.type == Tok::Name || t.type == Tok::String || t.type == Tok::Int || t.type == Tok::Float ||
                is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) error("you cannot chain multiple tests with 'is'");
      DepthGuard guard(*this);
      n->items.push_back(parse_postfix(parse_primary()));
    }
    return n;
  }
};

}  // namespace

Body parse(const std::vector<Token>& tokens, const std::string& name) {
  return Parser(tokens, name).parse_template();
}

}  // namespace ellm::jinja
