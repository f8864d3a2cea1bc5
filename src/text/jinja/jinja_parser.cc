// The parser's statements: the template's text, output and tags with their blocks (the
// expressions inside them: jinja_parser_expr.cc), and parse() itself.
#include "text/jinja/jinja_parser.h"

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/jinja_parser_impl.h"

namespace ellm::jinja {

// Parses until a block tag named in `end_tags`; leaves the cursor on that tag's name.
Body Parser::subparse(std::initializer_list<const char*> end_tags) {
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

StmtPtr Parser::parse_statement() {
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

StmtPtr Parser::parse_if(int line) {
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

StmtPtr Parser::parse_for(int line) {
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
ExprPtr Parser::parse_assign_target(const char* end_name, bool with_namespace) {
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

StmtPtr Parser::parse_set(int line) {
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

void Parser::parse_params(std::vector<MacroParam>& params) {
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

StmtPtr Parser::parse_macro(int line) {
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

StmtPtr Parser::parse_call_block(int line) {
  auto s = stmt(Stmt::Kind::CallBlock, line);
  if (is_op("(")) parse_params(s->params);
  s->expr = parse_expression();
  if (s->expr->kind != Expr::Kind::Call) error("'call' block needs a macro call", line);
  expect(Tok::BlockEnd);
  s->body = subparse({"endcall"});
  end_tag("endcall");
  return s;
}

StmtPtr Parser::parse_filter_block(int line) {
  auto s = stmt(Stmt::Kind::FilterBlock, line);
  s->filter = parse_filter(nullptr, true);
  expect(Tok::BlockEnd);
  s->body = subparse({"endfilter"});
  end_tag("endfilter");
  return s;
}

StmtPtr Parser::parse_with(int line) {
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
StmtPtr Parser::parse_generation(int line) {
  auto s = stmt(Stmt::Kind::Scope, line);
  expect(Tok::BlockEnd);
  s->body = subparse({"endgeneration"});
  end_tag("endgeneration");
  return s;
}

Body parse(const std::vector<Token>& tokens, const std::string& name) {
  return Parser(tokens, name).parse_template();
}

}  // namespace ellm::jinja
