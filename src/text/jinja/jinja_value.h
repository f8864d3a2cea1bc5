#pragma once
// The value model of the Jinja engine: Python's data types as templates see them
// (None, bool, int, float, str, list, dict) plus Jinja's own: Undefined, namespace objects and
// callables (macros, bound string/dict methods, globals such as range()).
//
// Lists, dicts and callables are shared by pointer, so copying a Value is cheap; strings are
// UTF-8 and copied by value. Dicts keep insertion order, as Python dicts do (tojson and
// `for k, v in d|items` must list keys in the order the request gave them).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ellm::jinja {

struct Value;
struct CallArgs;
using List = std::vector<Value>;

struct Dict {
  std::vector<std::pair<std::string, Value>> entries;

  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
};

// A function callable from templates. `fn` receives the evaluated arguments.
struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> fn;
};

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

struct Value {
  Kind kind = Kind::Undefined;
  bool is_tuple = false;  // a List that Python would hold as a tuple: only its repr differs
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string str;
  std::shared_ptr<List> list;          // Kind::List
  std::shared_ptr<Dict> dict;          // Kind::Dict and Kind::Namespace (mutable attributes)
  std::shared_ptr<Callable> callable;  // Kind::Callable
  // Kind::Undefined keeps in `str` the error that using it raises, e.g. "'x' is undefined".

  static Value undefined(std::string why = "") {
    Value v;
    v.str = std::move(why);
    return v;
  }
  static Value none() { return make(Kind::None); }
  static Value from_bool(bool b) {
    Value v = make(Kind::Bool);
    v.boolean = b;
    return v;
  }
  static Value from_int(int64_t i) {
    Value v = make(Kind::Int);
    v.integer = i;
    return v;
  }
  static Value from_float(double d) {
    Value v = make(Kind::Float);
    v.real = d;
    return v;
  }
  static Value from_string(std::string s) {
    Value v = make(Kind::String);
    v.str = std::move(s);
    return v;
  }
  static Value from_list(List items) {
    Value v = make(Kind::List);
    v.list = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value tuple(List items) {
    Value v = from_list(std::move(items));
    v.is_tuple = true;
    return v;
  }
  static Value from_dict(Dict d) {
    Value v = make(Kind::Dict);
    v.dict = std::make_shared<Dict>(std::move(d));
    return v;
  }
  static Value new_namespace() {
    Value v = make(Kind::Namespace);
    v.dict = std::make_shared<Dict>();
    return v;
  }
  static Value function(std::string name, std::function<Value(CallArgs&)> fn) {
    Value v = make(Kind::Callable);
    v.callable = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
    return v;
  }

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }

 private:
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

// Arguments of a call: positional then keyword, as written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;

  // Argument `index` or keyword `name`, whichever was given; Undefined if neither.
  Value get(size_t index, const std::string& name) const;
  bool has(size_t index, const std::string& name) const;
};

// Converting JSON inputs (ordered, so dict key order survives).
Value from_json(const nlohmann::ordered_json& j);

// Python semantics.
bool truthy(const Value& v);
std::string type_name(const Value& v);            // "str", "int", "dict", ... (Python's names)
std::string to_str(const Value& v);               // str(v); Undefined -> ""
std::string to_repr(const Value& v);              // repr(v), used inside list/dict str()
std::string python_float_repr(double d);          // repr(1.0) == "1.0", repr(1e-05) == "1e-05"
bool equals(const Value& a, const Value& b);      // ==
int compare(const Value& a, const Value& b);      // <0, 0, >0 for < == >; throws on unorderable

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as Python writes it: empty
// separators mean Python's defaults (", " and ": "; "," and ": " when indented); indent < 0
// means None.
struct JsonOptions {
  bool ensure_ascii = false;
  int indent = -1;
  bool sort_keys = false;
  std::string item_separator, key_separator;
};
std::string to_json(const Value& v, const JsonOptions& options = {});

// A rendering failure; the interpreter fills in the template line where it surfaced.
struct TemplateFailure {
  std::string message;
  int line = 0;
};
// raise_exception(msg) from a template: reported with exactly the template's message.
struct TemplateRaised {
  std::string message;
};
[[noreturn]] void template_error(const std::string& message);

}  // namespace ellm::jinja
