#include "text/jinja/jinja_interp.h"

#include <cmath>

#include "base/error.h"
#include "text/jinja/jinja_lexer.h"
#include "text/jinja/jinja_parser.h"
#include "text/jinja/jinja_strings.h"

namespace ellm::jinja {

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get())
    for (const auto& [k, v] : s->vars)
      if (k == name) return &v;
  return nullptr;
}

void Scope::set(const std::string& name, Value value) {
  for (auto& [k, v] : vars)
    if (k == name) {
      v = std::move(value);
      return;
    }
  vars.emplace_back(name, std::move(value));
}

Interpreter::Interpreter(const std::string& name, const Limits& limits) : name_(name), limits_(limits) {}

Interpreter::~Interpreter() {
  // Namespaces may hold each other (set ns.a = ns): drop their contents so nothing leaks.
  for (auto& weak : namespaces_)
    if (auto ns = weak.lock()) ns->entries.clear();
}

Interpreter::DepthGuard::DepthGuard(Interpreter& i) : in(i) {
  if (++in.depth_ > in.limits_.max_depth) template_error("template recursion too deep");
}

void Interpreter::charge(size_t work) {
  steps_ += 1 + work / 64;
  if (steps_ > limits_.max_steps) template_error("template exceeded its step budget (endless loop?)");
}

void Interpreter::check_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes)
    template_error("string of " + std::to_string(bytes) + " bytes exceeds the limit of " +
                   std::to_string(limits_.max_output_bytes));
}

void Interpreter::check_items(size_t items) const {
  if (items > limits_.max_list_items)
    template_error("list of " + std::to_string(items) + " items exceeds the limit of " +
                   std::to_string(limits_.max_list_items));
}

Value Interpreter::new_namespace() {
  Value ns = Value::new_namespace();
  namespaces_.push_back(ns.dict);
  return ns;
}

std::string Interpreter::run(const Body& body, const std::vector<std::pair<std::string, Value>>& variables) {
  auto globals = std::make_shared<Scope>();
  globals->vars = make_globals(*this);
  root_ = std::make_shared<Scope>();
  root_->parent = globals;
  for (const auto& [k, v] : variables) root_->set(k, v);
  scope_ = root_;
  std::string out;
  out_ = &out;
  try {
    exec_body(body);
  } catch (const TemplateFailure& f) {
    throw Error(name_ + ":" + std::to_string(f.line) + ": " + f.message);
  } catch (const TemplateRaised& r) {
    throw Error(r.message);
  }
  return out;
}

void Interpreter::write(const std::string& s) {
  charge(s.size());
  check_size(out_->size() + s.size());
  *out_ += s;
}

// ---- statements ----

Interpreter::Flow Interpreter::exec_body(const Body& body) {
  for (const StmtPtr& s : body) {
    Flow f = exec(*s);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s) {
  DepthGuard guard(*this);
  charge(0);
  try {
    switch (s.kind) {
      case Stmt::Kind::Text: write(s.text); break;
      case Stmt::Kind::Output: write(to_str(eval(*s.expr))); break;
      case Stmt::Kind::If: return exec_body(truthy(eval(*s.expr)) ? s.body : s.orelse);
      case Stmt::Kind::For: return exec_for(s);
      case Stmt::Kind::Set: exec_set(s); break;
      case Stmt::Kind::SetBlock: {
        Value text = Value::from_string(capture(s.body, scope_));
        if (s.filter) {
          filter_input_ = &text;
          text = eval(*s.filter);
        }
        scope_->set(s.name, std::move(text));
        break;
      }
      case Stmt::Kind::Macro: scope_->set(s.name, make_macro(s, scope_, s.name)); break;
      case Stmt::Kind::CallBlock: exec_call_block(s); break;
      case Stmt::Kind::FilterBlock: {
        Value text = Value::from_string(capture(s.body, scope_));
        filter_input_ = &text;
        write(to_str(eval(*s.filter)));
        break;
      }
      case Stmt::Kind::Scope: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope_;
        for (const auto& [name, expr] : s.assignments) inner->set(name, eval(*expr));
        auto saved = scope_;
        scope_ = inner;
        Flow f = exec_body(s.body);
        scope_ = saved;
        return f;
      }
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
    }
  } catch (TemplateFailure& f) {
    if (!f.line) f.line = s.line;
    throw;
  }
  return Flow::Normal;
}

void Interpreter::assign(const Expr& target, const Value& value, Scope& scope) {
  if (target.kind == Expr::Kind::Name) {
    scope.set(target.name, value);
    return;
  }
  // Tuple unpacking: `for key, value in d|items`, `set a, b = pair`.
  List items = iterate(value);
  if (items.size() != target.items.size())
    template_error(items.size() < target.items.size()
                       ? "not enough values to unpack (expected " + std::to_string(target.items.size()) + ", got " +
                             std::to_string(items.size()) + ")"
                       : "too many values to unpack (expected " + std::to_string(target.items.size()) + ")");
  for (size_t i = 0; i < items.size(); ++i) assign(*target.items[i], items[i], scope);
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s) {
  Value iterable = eval(*s.expr);
  List items = iterate(iterable);
  auto outer = scope_;
  if (s.cond) {  // {% for x in xs if cond %}: filter first, so loop.length counts kept items
    List kept;
    for (Value& item : items) {
      auto probe = std::make_shared<Scope>();
      probe->parent = outer;
      assign(*s.target, item, *probe);
      scope_ = probe;
      bool keep = truthy(eval(*s.cond));
      scope_ = outer;
      if (keep) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const int64_t n = int64_t(items.size());
  for (int64_t i = 0; i < n; ++i) {
    charge(0);
    auto body_scope = std::make_shared<Scope>();
    body_scope->parent = outer;
    assign(*s.target, items[size_t(i)], *body_scope);
    Dict loop;
    loop.entries = {
        {"index", Value::from_int(i + 1)},
        {"index0", Value::from_int(i)},
        {"revindex", Value::from_int(n - i)},
        {"revindex0", Value::from_int(n - i - 1)},
        {"first", Value::from_bool(i == 0)},
        {"last", Value::from_bool(i == n - 1)},
        {"length", Value::from_int(n)},
        {"depth", Value::from_int(1)},
        {"depth0", Value::from_int(0)},
        {"previtem", i > 0 ? items[size_t(i - 1)] : Value::undefined("there is no previous item")},
        {"nextitem", i + 1 < n ? items[size_t(i + 1)] : Value::undefined("there is no next item")},
        {"cycle", Value::function("loop.cycle", [i](CallArgs& args) {
           if (args.positional.empty()) template_error("loop.cycle() needs at least one argument");
           return args.positional[size_t(i) % args.positional.size()];
         })},
    };
    body_scope->set("loop", Value::from_dict(std::move(loop)));
    scope_ = body_scope;
    Flow f = exec_body(s.body);
    scope_ = outer;
    if (f == Flow::Break) break;
  }
  if (n == 0) return exec_body(s.orelse);
  return Flow::Normal;
}

void Interpreter::exec_set(const Stmt& s) {
  Value value = eval(*s.expr);
  if (s.target->kind == Expr::Kind::Attr) {  // set ns.attr = value
    const Value* ns = scope_->find(s.target->object->name);
    if (!ns || ns->kind != Kind::Namespace)
      template_error("cannot assign attribute on non-namespace object '" + s.target->object->name + "'");
    ns->dict->set(s.target->name, std::move(value));
    return;
  }
  assign(*s.target, value, *scope_);
}

std::string Interpreter::capture(const Body& body, const std::shared_ptr<Scope>& scope) {
  std::string buffer;
  std::string* saved_out = out_;
  auto saved_scope = scope_;
  out_ = &buffer;
  scope_ = scope;
  exec_body(body);
  out_ = saved_out;
  scope_ = saved_scope;
  return buffer;
}

// A macro is a callable that renders its body in a fresh scope whose parent is the scope the
// macro was defined in (weakly held: a scope can outlive neither its render nor itself).
Value Interpreter::make_macro(const Stmt& s, const std::shared_ptr<Scope>& scope, const std::string& name) {
  std::weak_ptr<Scope> defined_in = scope;
  return Value::function(name, [this, &s, defined_in, name](CallArgs& args) {
    DepthGuard guard(*this);
    auto frame = std::make_shared<Scope>();
    frame->parent = defined_in.lock();
    if (!frame->parent) frame->parent = root_;
    auto saved = scope_;
    scope_ = frame;
    for (size_t i = 0; i < s.params.size(); ++i) {
      const MacroParam& p = s.params[i];
      if (args.has(i, p.name)) frame->set(p.name, args.get(i, p.name));
      else if (p.default_value) frame->set(p.name, eval(*p.default_value));
      else frame->set(p.name, Value::undefined("parameter '" + p.name + "' was not provided"));
    }
    List varargs;
    for (size_t i = s.params.size(); i < args.positional.size(); ++i) varargs.push_back(args.positional[i]);
    Dict kwargs;
    for (const auto& [k, v] : args.named) {
      bool is_param = false;
      for (const MacroParam& p : s.params) is_param |= p.name == k;
      if (k == "caller") frame->set("caller", v);
      else if (!is_param) kwargs.set(k, v);
    }
    frame->set("varargs", Value::tuple(std::move(varargs)));
    frame->set("kwargs", Value::from_dict(std::move(kwargs)));
    scope_ = saved;
    return Value::from_string(capture(s.body, frame));
  });
}

void Interpreter::exec_call_block(const Stmt& s) {
  CallArgs args;
  eval_args(*s.expr, args);
  Value callee = eval(*s.expr->object);
  args.named.emplace_back("caller", make_macro(s, scope_, "caller"));
  write(to_str(call(callee, args)));
}

// ---- expressions ----

Value Interpreter::eval(const Expr& e) {
  DepthGuard guard(*this);
  charge(0);
  try {
    return eval_node(e);
  } catch (TemplateFailure& f) {
    if (!f.line) f.line = e.line;
    throw;
  }
}

Value Interpreter::eval_node(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::Literal: return e.literal;
    case Expr::Kind::Name: {
      const Value* v = scope_->find(e.name);
      return v ? *v : Value::undefined("'" + e.name + "' is undefined");
    }
    case Expr::Kind::List:
    case Expr::Kind::Tuple: {
      List items;
      for (const ExprPtr& item : e.items) items.push_back(eval(*item));
      return e.kind == Expr::Kind::Tuple ? Value::tuple(std::move(items)) : Value::from_list(std::move(items));
    }
    case Expr::Kind::Dict: {
      Dict d;
      for (size_t i = 0; i < e.keys.size(); ++i) {
        Value key = eval(*e.keys[i]);
        if (!key.is_string()) template_error("dict keys must be strings, got " + type_name(key));
        d.set(key.str, eval(*e.items[i]));
      }
      return Value::from_dict(std::move(d));
    }
    case Expr::Kind::Attr: return get_attr(eval(*e.object), e.name);
    case Expr::Kind::Item: return get_item(eval(*e.object), eval(*e.right));
    case Expr::Kind::Slice: return eval_slice(e);
    case Expr::Kind::Call: return eval_call(e);
    case Expr::Kind::Filter: return eval_filter(e);
    case Expr::Kind::Test: {
      Value v = eval(*e.object);
      CallArgs args;
      eval_args(e, args);
      return Value::from_bool(test(e.name, v, args) != e.negated);
    }
    case Expr::Kind::Unary: {
      Value v = eval(*e.object);
      if (e.name == "not") return Value::from_bool(!truthy(v));
      if (v.is_undefined()) undefined_error(v);
      if (!v.is_number()) template_error("bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
      if (e.name == "+") return v.kind == Kind::Bool ? Value::from_int(v.boolean) : v;
      if (v.kind == Kind::Float) return Value::from_float(-v.real);
      int64_t i = v.kind == Kind::Bool ? v.boolean : v.integer;
      if (i == INT64_MIN) template_error("integer overflow");
      return Value::from_int(-i);
    }
    case Expr::Kind::Binary: return eval_binary(e);
    case Expr::Kind::Compare: return eval_compare(e);
    case Expr::Kind::And: {
      Value left = eval(*e.left);
      return truthy(left) ? eval(*e.right) : left;
    }
    case Expr::Kind::Or: {
      Value left = eval(*e.left);
      return truthy(left) ? left : eval(*e.right);
    }
    case Expr::Kind::Cond:
      if (truthy(eval(*e.cond))) return eval(*e.then);
      if (e.otherwise) return eval(*e.otherwise);
      return Value::undefined("the inline if-expression evaluated to false and has no else section");
  }
  return Value::undefined();
}

void Interpreter::eval_args(const Expr& e, CallArgs& args) {
  for (const ExprPtr& item : e.items) args.positional.push_back(eval(*item));
  for (const auto& [k, v] : e.keywords) args.named.emplace_back(k, eval(*v));
}

Value Interpreter::eval_call(const Expr& e) {
  Value callee = eval(*e.object);
  CallArgs args;
  eval_args(e, args);
  return call(callee, args);
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.kind == Kind::Callable) return callee.callable->fn(args);
  if (callee.is_undefined()) undefined_error(callee);
  template_error("'" + type_name(callee) + "' object is not callable");
}

Value Interpreter::eval_filter(const Expr& e) {
  Value input = e.object ? eval(*e.object) : *filter_input_;
  CallArgs args;
  eval_args(e, args);
  return filter(e.name, input, args);
}

Value Interpreter::filter(const std::string& name, const Value& input, CallArgs& args) {
  return apply_filter(*this, name, input, args);
}

bool Interpreter::test(const std::string& name, const Value& input, CallArgs& args) {
  return apply_test(*this, name, input, args);
}

Value Interpreter::eval_compare(const Expr& e) {
  Value left = eval(*e.items[0]);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.items[i + 1]);
    const std::string& op = e.ops[i];
    bool result;
    if (op == "==") result = equals(left, right);
    else if (op == "!=") result = !equals(left, right);
    else if (op == "in") result = contains(right, left);
    else if (op == "not in") result = !contains(right, left);
    else {
      if (left.is_undefined()) undefined_error(left);
      if (right.is_undefined()) undefined_error(right);
      int c = compare(left, right);
      result = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!result) return Value::from_bool(false);
    left = std::move(right);
  }
  return Value::from_bool(true);
}

// Python's slice.indices(): clamps start/stop for the given length and step.
static void slice_indices(int64_t length, const Value& start_v, const Value& stop_v, const Value& step_v,
                          int64_t& start, int64_t& stop, int64_t& step) {
  auto as_index = [](const Value& v, bool& given) -> int64_t {
    given = !(v.is_undefined() || v.is_none());
    if (!given) return 0;
    if (v.kind == Kind::Int) return v.integer;
    if (v.kind == Kind::Bool) return v.boolean;
    template_error("slice indices must be integers or None");
  };
  bool has_start, has_stop, has_step;
  step = as_index(step_v, has_step);
  if (!has_step) step = 1;
  if (step == 0) template_error("slice step cannot be zero");
  if (step == INT64_MIN) step = -INT64_MAX;
  int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? length - 1 : length;
  auto clamp = [&](int64_t v, bool given, int64_t fallback) {
    if (!given) return fallback;
    if (v < 0) {
      v = v < -length ? lower : v + length;
      return v < lower ? lower : v;
    }
    return v > upper ? upper : v;
  };
  int64_t raw_start = as_index(start_v, has_start);
  int64_t raw_stop = as_index(stop_v, has_stop);
  start = clamp(raw_start, has_start, step < 0 ? upper : lower);
  stop = clamp(raw_stop, has_stop, step < 0 ? lower : upper);
}

Value Interpreter::eval_slice(const Expr& e) {
  Value object = eval(*e.object);
  Value start_v = e.start ? eval(*e.start) : Value::none();
  Value stop_v = e.stop ? eval(*e.stop) : Value::none();
  Value step_v = e.step ? eval(*e.step) : Value::none();
  if (object.is_undefined()) undefined_error(object);
  auto pick = [&](int64_t length, auto&& take) {
    int64_t start, stop, step;
    slice_indices(length, start_v, stop_v, step_v, start, stop, step);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) take(size_t(i));
  };
  if (object.kind == Kind::List) {
    List out;
    pick(int64_t(object.list->size()), [&](size_t i) { out.push_back((*object.list)[i]); });
    charge(out.size() * 16);
    return Value::from_list(std::move(out));
  }
  if (object.kind == Kind::String) {
    std::vector<std::string_view> chars = split_codepoints(object.str);
    std::string out;
    pick(int64_t(chars.size()), [&](size_t i) { out += chars[i]; });
    charge(object.str.size());
    return Value::from_string(std::move(out));
  }
  template_error("'" + type_name(object) + "' object is not subscriptable");
}

// ---- Template ----

namespace {

// Like jinja2, unknown filters and tests fail when the template is loaded, except inside
// `if` branches and conditional expressions, where they fail only if evaluated.
struct Validator {
  const std::string& name;

  void check(const Expr* e, bool soft) {
    if (!e) return;
    if (!soft && e->kind == Expr::Kind::Filter && !is_known_filter(e->name))
      throw Error(name + ":" + std::to_string(e->line) + ": unknown filter '" + e->name + "'");
    if (!soft && e->kind == Expr::Kind::Test && !is_known_test(e->name))
      throw Error(name + ":" + std::to_string(e->line) + ": unknown test '" + e->name + "'");
    bool branch_soft = soft || e->kind == Expr::Kind::Cond;
    for (const Expr* child : {e->object.get(), e->left.get(), e->right.get(), e->cond.get(), e->start.get(),
                              e->stop.get(), e->step.get()})
      check(child, soft);
    check(e->then.get(), branch_soft);
    check(e->otherwise.get(), branch_soft);
    for (const ExprPtr& child : e->items) check(child.get(), soft);
    for (const ExprPtr& child : e->keys) check(child.get(), soft);
    for (const auto& [k, child] : e->keywords) check(child.get(), soft);
  }

  void check(const Body& body, bool soft) {
    for (const StmtPtr& s : body) {
      for (const Expr* child : {s->expr.get(), s->target.get(), s->cond.get(), s->filter.get()}) check(child, soft);
      for (const MacroParam& p : s->params) check(p.default_value.get(), soft);
      for (const auto& [k, child] : s->assignments) check(child.get(), soft);
      bool branch_soft = soft || s->kind == Stmt::Kind::If;
      check(s->body, branch_soft);
      check(s->orelse, branch_soft);
    }
  }
};

}  // namespace

Template Template::parse(const std::string& source, const std::string& name) {
  Template t;
  t.name_ = name;
  auto body = std::make_shared<Body>(jinja::parse(lex(source, name), name));
  Validator{name}.check(*body, false);
  t.body_ = std::move(body);
  return t;
}

std::string Template::render(const std::vector<std::pair<std::string, Value>>& variables, const Limits& limits) const {
  Interpreter interpreter(name_, limits);
  return interpreter.run(*body_, variables);
}

std::string Template::render(const nlohmann::ordered_json& context, const Limits& limits) const {
  if (!context.is_object()) throw Error(name_ + ": template context must be a JSON object");
  std::vector<std::pair<std::string, Value>> variables;
  for (const auto& [k, v] : context.items()) variables.emplace_back(k, from_json(v));
  return render(variables, limits);
}

}  // namespace ellm::jinja
