#pragma once
// Syntax tree of a parsed template. Nodes are plain structs with a kind tag; the fields a
// kind uses are listed beside it.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/jinja_value.h"

namespace ellm::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    Literal,  // literal
    Name,     // name
    List,     // items
    Tuple,    // items (also a `for`/`set` target list)
    Dict,     // keys[i]: items[i]
    Attr,     // object.name
    Item,     // object[index]
    Slice,    // object[start:stop:step] (any of the three may be null)
    Call,     // object(items, keywords)
    Filter,   // object | name(items, keywords); object null inside a {% filter %} block
    Test,     // object is [not] name(items)      (negated)
    Unary,    // op object                        ("-", "+", "not")
    Binary,   // left op right                    (+ - * / // % ** ~)
    Compare,  // items[0] ops[0] items[1] ops[1] ... (== != < <= > >= in, "not in"), chained as Python
    And,      // left and right
    Or,       // left or right
    Cond,     // then if cond else otherwise     (otherwise may be null)
  };
  Kind kind;
  int line;
  Value literal;
  std::string name;  // Name, Attr, Filter, Test; the operator for Unary/Binary
  bool negated = false;
  ExprPtr object, left, right, cond, then, otherwise, start, stop, step;
  std::vector<ExprPtr> items;
  std::vector<ExprPtr> keys;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;  // Compare
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  enum class Kind {
    Text,         // text
    Output,       // {{ expr }}
    If,           // if expr: body else orelse (elif chains nest in orelse)
    For,          // for target in expr [if cond]: body else orelse
    Set,          // set target = expr   (target: Name, Tuple of Names, or Attr on a namespace)
    SetBlock,     // set name %} body {% endset   (optionally filtered through `filter`)
    Macro,        // macro name(params) body
    CallBlock,    // call(params) expr %} body {% endcall
    FilterBlock,  // filter `filter` %} body {% endfilter
    Scope,        // with / generation: body in a new scope, `assignments` first
    Break,
    Continue,
  };
  Kind kind;
  int line;
  std::string text;  // Text
  std::string name;  // Macro, SetBlock
  ExprPtr expr, target, cond, filter;
  Body body, orelse;
  std::vector<MacroParam> params;
  std::vector<std::pair<std::string, ExprPtr>> assignments;  // Scope (with a = 1, b = 2)
};

}  // namespace ellm::jinja
