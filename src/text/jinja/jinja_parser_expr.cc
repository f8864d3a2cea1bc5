// The parser's expressions (jinja2/parser.py, same names and precedence): filters and tests
// bind tighter than arithmetic; `x if c else y` is loosest.
#include <cerrno>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/jinja_parser_impl.h"

namespace ellm::jinja {

bool Parser::at_tuple_end(const char* extra_end) const {
  const Token& t = cur();
  if (t.type == Tok::VarEnd || t.type == Tok::BlockEnd || t.type == Tok::End) return true;
  if (t.type == Tok::Op && t.value == ")") return true;
  return extra_end && t.type == Tok::Name && t.value == extra_end;
}

ExprPtr Parser::parse_tuple(bool with_condexpr, const char* extra_end, bool explicit_parens) {
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

ExprPtr Parser::parse_condexpr() {
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

ExprPtr Parser::parse_or() {
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

ExprPtr Parser::parse_and() {
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

ExprPtr Parser::parse_not() {
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

ExprPtr Parser::parse_compare() {
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

ExprPtr Parser::binary(const std::string& op, ExprPtr left, ExprPtr right, int line) {
  auto n = node(Expr::Kind::Binary, line);
  n->name = op;
  n->left = std::move(left);
  n->right = std::move(right);
  return n;
}

ExprPtr Parser::parse_math1() {
  ExprPtr left = parse_concat();
  while (is_op("+") || is_op("-")) {
    std::string op = cur().value;
    int line = cur().line;
    next();
    left = binary(op, std::move(left), parse_concat(), line);
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  ExprPtr left = parse_math2();
  while (is_op("~")) {
    int line = cur().line;
    next();
    left = binary("~", std::move(left), parse_math2(), line);
  }
  return left;
}

ExprPtr Parser::parse_math2() {
  ExprPtr left = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    std::string op = cur().value;
    int line = cur().line;
    next();
    left = binary(op, std::move(left), parse_pow(), line);
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary();
  while (is_op("**")) {
    int line = cur().line;
    next();
    left = binary("**", std::move(left), parse_unary(), line);
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
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

ExprPtr Parser::literal(Value v, int line) {
  auto n = node(Expr::Kind::Literal, line);
  n->literal = std::move(v);
  return n;
}

ExprPtr Parser::parse_primary() {
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

ExprPtr Parser::parse_list() {
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

ExprPtr Parser::parse_dict() {
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

ExprPtr Parser::parse_postfix(ExprPtr n) {
  while (true) {
    if (is_op(".") || is_op("[")) n = parse_subscript(std::move(n));
    else if (is_op("(")) n = parse_call(std::move(n));
    else return n;
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr n) {
  while (true) {
    if (is_op("|")) n = parse_filter(std::move(n));
    else if (is_name("is")) n = parse_test(std::move(n));
    else if (is_op("(")) n = parse_call(std::move(n));
    else return n;
  }
}

ExprPtr Parser::parse_subscript(ExprPtr object) {
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

ExprPtr Parser::parse_subscribed() {
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

void Parser::parse_call_args(Expr& call) {
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

ExprPtr Parser::parse_call(ExprPtr callee) {
  auto n = node(Expr::Kind::Call, cur().line);
  n->object = std::move(callee);
  parse_call_args(*n);
  return n;
}

std::string Parser::dotted_name() {
  std::string n = expect_name();
  while (is_op(".")) {
    next();
    n += "." + expect_name();
  }
  return n;
}

// `| name(args)` chain; with start_inline the first filter has no leading '|'.
ExprPtr Parser::parse_filter(ExprPtr object, bool start_inline) {
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

ExprPtr Parser::parse_test(ExprPtr object) {
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

}  // namespace ellm::jinja
