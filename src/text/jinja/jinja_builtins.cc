// Attribute and item access, Python methods on str/dict/list, tests and globals, as
// jinja2's ImmutableSandboxedEnvironment plus Hugging Face's additions provide them.
#include <ctime>

#include "text/jinja/jinja_interp.h"
#include "text/jinja/jinja_strings.h"

namespace ellm::jinja {

void undefined_error(const Value& undefined) {
  template_error(undefined.str.empty() ? "value is undefined" : undefined.str);
}

static std::string object_name(const Value& v) {
  return v.is_none() ? "'None'" : "'" + type_name(v) + " object'";
}

static Value no_attribute(const Value& object, const std::string& name) {
  return Value::undefined(object_name(object) + " has no attribute '" + name + "'");
}

List iterate(const Value& v) {
  switch (v.kind) {
    case Kind::List: return *v.list;
    case Kind::Dict: {
      List keys;
      for (const auto& [k, e] : v.dict->entries) keys.push_back(Value::from_string(k));
      return keys;
    }
    case Kind::String: {
      List chars;
      for (std::string_view c : split_codepoints(v.str)) chars.push_back(Value::from_string(std::string(c)));
      return chars;
    }
    case Kind::Undefined: return {};
    default: template_error("'" + type_name(v) + "' object is not iterable");
  }
}

size_t length(const Value& v) {
  switch (v.kind) {
    case Kind::String: return codepoint_count(v.str);
    case Kind::List: return v.list->size();
    case Kind::Dict: return v.dict->entries.size();
    case Kind::Undefined: return 0;
    default: template_error("object of type '" + type_name(v) + "' has no len()");
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::String:
      if (!item.is_string())
        template_error("'in <string>' requires string as left operand, not " + type_name(item));
      return container.str.find(item.str) != std::string::npos;
    case Kind::List:
      for (const Value& e : *container.list)
        if (equals(e, item)) return true;
      return false;
    case Kind::Dict: return item.is_string() && container.dict->find(item.str) != nullptr;
    case Kind::Undefined: return false;
    default: template_error("argument of type '" + type_name(container) + "' is not iterable");
  }
}

// ---- methods ----

static const std::string* optional_string(const Value& v, const char* method) {
  if (v.is_undefined() || v.is_none()) return nullptr;
  if (!v.is_string()) template_error(std::string(method) + "() argument must be str or None, not " + type_name(v));
  return &v.str;
}

static int64_t method_int_arg(const Value& v, int64_t fallback) {
  if (v.is_undefined()) return fallback;
  if (v.kind == Kind::Int) return v.integer;
  if (v.kind == Kind::Bool) return v.boolean;
  template_error("'" + type_name(v) + "' object cannot be interpreted as an integer");
}

static Value string_list(const std::vector<std::string>& parts) {
  List out;
  for (const std::string& p : parts) out.push_back(Value::from_string(p));
  return Value::from_list(std::move(out));
}

// str.startswith / endswith accept a string or a tuple of strings.
static bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) template_error(std::string(prefix ? "startswith" : "endswith") + " first arg must be str or a tuple of str");
    if (a.str.size() > s.size()) return false;
    return prefix ? s.compare(0, a.str.size(), a.str) == 0 : s.compare(s.size() - a.str.size(), a.str.size(), a.str) == 0;
  };
  if (affix.kind == Kind::List) {
    for (const Value& a : *affix.list)
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

static Value string_method(const std::string& s, const std::string& name) {
  using A = CallArgs;
  auto method = [&](auto fn) { return Value::function("str." + name, [s, fn](A& a) { return fn(s, a); }); };
  if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    return method([prefix](const std::string& s, A& a) { return Value::from_bool(affix_match(s, a.get(0, "prefix"), prefix)); });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool left = name != "rstrip", right = name != "lstrip";
    return method([left, right](const std::string& s, A& a) {
      Value chars = a.get(0, "chars");
      return Value::from_string(py_strip(s, optional_string(chars, "strip"), left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    bool reverse = name == "rsplit";
    return method([reverse](const std::string& s, A& a) {
      Value sep = a.get(0, "sep");
      const std::string* sep_str = optional_string(sep, "split");
      if (sep_str && sep_str->empty()) template_error("empty separator");
      int64_t maxsplit = method_int_arg(a.get(1, "maxsplit"), -1);
      return string_list(reverse ? py_rsplit(s, sep_str, maxsplit) : py_split(s, sep_str, maxsplit));
    });
  }
  if (name == "splitlines")
    return method([](const std::string& s, A&) {
      std::vector<std::string> lines;
      size_t start = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] != '\n' && s[i] != '\r') continue;
        lines.push_back(s.substr(start, i - start));
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
        start = i + 1;
      }
      if (start < s.size()) lines.push_back(s.substr(start));
      return string_list(lines);
    });
  if (name == "replace")
    return method([](const std::string& s, A& a) {
      Value from = a.get(0, "old"), to = a.get(1, "new");
      if (!from.is_string() || !to.is_string()) template_error("replace() arguments must be str");
      return Value::from_string(py_replace(s, from.str, to.str, method_int_arg(a.get(2, "count"), -1)));
    });
  if (name == "lower") return method([](const std::string& s, A&) { return Value::from_string(py_lower(s)); });
  if (name == "upper") return method([](const std::string& s, A&) { return Value::from_string(py_upper(s)); });
  if (name == "title") return method([](const std::string& s, A&) { return Value::from_string(py_title(s)); });
  if (name == "capitalize") return method([](const std::string& s, A&) { return Value::from_string(py_capitalize(s)); });
  if (name == "find" || name == "rfind" || name == "count")
    return method([name](const std::string& s, A& a) {
      Value sub = a.get(0, "sub");
      if (!sub.is_string()) template_error(name + "() argument must be str");
      if (name == "count") {
        if (sub.str.empty()) return Value::from_int(int64_t(codepoint_count(s)) + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub.str); p != std::string::npos; p = s.find(sub.str, p + sub.str.size())) ++n;
        return Value::from_int(n);
      }
      size_t p = name == "find" ? s.find(sub.str) : s.rfind(sub.str);
      return Value::from_int(p == std::string::npos ? -1 : int64_t(codepoint_count(std::string_view(s).substr(0, p))));
    });
  if (name == "join")
    return method([](const std::string& s, A& a) {
      std::string out;
      bool first = true;
      for (const Value& v : iterate(a.get(0, "iterable"))) {
        if (!v.is_string()) template_error("sequence item: expected str instance, " + type_name(v) + " found");
        if (!first) out += s;
        out += v.str;
        first = false;
      }
      return Value::from_string(std::move(out));
    });
  auto predicate = [&](auto test) {
    return method([test](const std::string& s, A&) {
      if (s.empty()) return Value::from_bool(false);
      bool all = true;
      for_each_codepoint(s, [&](char32_t cp, std::string_view) { all = all && test(cp); });
      return Value::from_bool(all);
    });
  };
  if (name == "isspace") return predicate([](char32_t c) { return is_space(c); });
  if (name == "isdigit") return predicate([](char32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha")
    return predicate([](char32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; });
  if (name == "isalnum")
    return predicate([](char32_t c) { return ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c >= '0' && c <= '9'); });
  if (name == "islower") return method([](const std::string& s, A&) { return Value::from_bool(py_lower(s) == s && py_upper(s) != s); });
  if (name == "isupper") return method([](const std::string& s, A&) { return Value::from_bool(py_upper(s) == s && py_lower(s) != s); });
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

static Value dict_method(const Value& d, const std::string& name) {
  std::shared_ptr<Dict> dict = d.dict;
  if (name == "items")
    return Value::function("dict.items", [dict](CallArgs&) {
      List out;
      for (const auto& [k, v] : dict->entries) out.push_back(Value::tuple({Value::from_string(k), v}));
      return Value::from_list(std::move(out));
    });
  if (name == "keys")
    return Value::function("dict.keys", [dict](CallArgs&) {
      List out;
      for (const auto& [k, v] : dict->entries) out.push_back(Value::from_string(k));
      return Value::from_list(std::move(out));
    });
  if (name == "values")
    return Value::function("dict.values", [dict](CallArgs&) {
      List out;
      for (const auto& [k, v] : dict->entries) out.push_back(v);
      return Value::from_list(std::move(out));
    });
  if (name == "get")
    return Value::function("dict.get", [dict](CallArgs& a) {
      Value key = a.get(0, "key");
      const Value* found = key.is_string() ? dict->find(key.str) : nullptr;
      if (found) return *found;
      Value fallback = a.get(1, "default");
      return fallback.is_undefined() ? Value::none() : fallback;
    });
  if (name == "copy") return Value::function("dict.copy", [dict](CallArgs&) { return Value::from_dict(*dict); });
  return Value();  // not a method
}

static bool is_mutating_method(const std::string& name) {
  for (const char* m : {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "update",
                        "setdefault", "popitem"})
    if (name == m) return true;
  return false;
}

Value get_attr(const Value& object, const std::string& name) {
  switch (object.kind) {
    case Kind::Undefined: undefined_error(object);
    case Kind::Dict: {
      if (is_mutating_method(name))
        return Value::undefined("access to attribute '" + name + "' of 'dict' object is unsafe");
      Value method = dict_method(object, name);
      if (method.kind == Kind::Callable) return method;
      if (const Value* v = object.dict->find(name)) return *v;
      return no_attribute(object, name);
    }
    case Kind::Namespace: {
      if (const Value* v = object.dict->find(name)) return *v;
      return no_attribute(object, name);
    }
    case Kind::String: return string_method(object.str, name);
    case Kind::List: {
      if (is_mutating_method(name))
        return Value::undefined("access to attribute '" + name + "' of 'list' object is unsafe");
      std::shared_ptr<List> list = object.list;
      if (name == "index" || name == "count")
        return Value::function("list." + name, [list, name](CallArgs& a) {
          Value item = a.get(0, "value");
          int64_t n = 0;
          for (size_t i = 0; i < list->size(); ++i) {
            if (!equals((*list)[i], item)) continue;
            if (name == "index") return Value::from_int(int64_t(i));
            ++n;
          }
          if (name == "index") template_error("value is not in list");
          return Value::from_int(n);
        });
      if (name == "copy") return Value::function("list.copy", [list](CallArgs&) { return Value::from_list(*list); });
      return no_attribute(object, name);
    }
    default: return no_attribute(object, name);
  }
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) undefined_error(object);
  if (object.kind == Kind::List || object.kind == Kind::String) {
    if (key.kind == Kind::Int || key.kind == Kind::Bool) {
      int64_t i = key.kind == Kind::Bool ? key.boolean : key.integer;
      if (object.kind == Kind::List) {
        int64_t n = int64_t(object.list->size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined(object_name(object) + " has no element " + std::to_string(key.integer));
        return (*object.list)[size_t(i)];
      }
      std::vector<std::string_view> chars = split_codepoints(object.str);
      int64_t n = int64_t(chars.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(object_name(object) + " has no element " + std::to_string(key.integer));
      return Value::from_string(std::string(chars[size_t(i)]));
    }
  }
  if (object.kind == Kind::Dict && key.is_string())
    if (const Value* v = object.dict->find(key.str)) return *v;
  if (key.is_string()) return get_attr(object, key.str);
  return Value::undefined(object_name(object) + " has no element " + to_repr(key));
}

// ---- tests ----

static const char* const kTests[] = {
    "defined", "undefined", "none", "string", "mapping", "sequence", "iterable", "number", "integer",
    "float", "boolean", "true", "false", "in", "callable", "odd", "even", "divisibleby", "eq", "equalto",
    "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "sameas",
    "lower", "upper", "escaped", "filter", "test"};

bool is_known_test(const std::string& name) {
  for (const char* t : kTests)
    if (name == t) return true;
  return false;
}

bool apply_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  Kind k = v.kind;
  if (name == "defined") return k != Kind::Undefined;
  if (name == "undefined") return k == Kind::Undefined;
  if (name == "none") return k == Kind::None;
  if (name == "string") return k == Kind::String;
  if (name == "mapping") return k == Kind::Dict;
  if (name == "sequence" || name == "iterable")
    return k == Kind::String || k == Kind::List || k == Kind::Dict || k == Kind::Undefined;
  if (name == "number") return v.is_number();
  if (name == "integer") return k == Kind::Int;
  if (name == "float") return k == Kind::Float;
  if (name == "boolean") return k == Kind::Bool;
  if (name == "true") return k == Kind::Bool && v.boolean;
  if (name == "false") return k == Kind::Bool && !v.boolean;
  if (name == "callable") return k == Kind::Callable;
  if (name == "escaped") return false;
  if (name == "lower") return k == Kind::String && py_lower(v.str) == v.str;
  if (name == "upper") return k == Kind::String && py_upper(v.str) == v.str;
  if (name == "filter") return v.is_string() && is_known_filter(v.str);
  if (name == "test") return v.is_string() && is_known_test(v.str);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (k != Kind::Int && k != Kind::Bool) template_error("test '" + name + "' needs an integer");
    int64_t i = k == Kind::Bool ? v.boolean : v.integer;
    if (name == "odd") return i % 2 != 0;
    if (name == "even") return i % 2 == 0;
    int64_t d = method_int_arg(args.get(0, "num"), 0);
    if (d == 0) template_error("integer modulo by zero");
    return d == -1 || i % d == 0;
  }
  Value other = args.get(0, "other");
  if (name == "in") return contains(other, v);
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, other);
  if (name == "ne" || name == "!=") return !equals(v, other);
  if (name == "sameas") {
    if (k != other.kind) return false;
    if (k == Kind::List) return v.list == other.list;
    if (k == Kind::Dict || k == Kind::Namespace) return v.dict == other.dict;
    if (k == Kind::Callable) return v.callable == other.callable;
    return equals(v, other);
  }
  if (v.is_undefined()) undefined_error(v);
  if (other.is_undefined()) undefined_error(other);
  int c = compare(v, other);
  if (name == "lt" || name == "lessthan" || name == "<") return c < 0;
  if (name == "le" || name == "<=") return c <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return c > 0;
  if (name == "ge" || name == ">=") return c >= 0;
  (void)in;
  template_error("unknown test '" + name + "'");
}

// ---- globals ----

std::vector<std::pair<std::string, Value>> make_globals(Interpreter& in) {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::function("range", [&in](CallArgs& a) {
    if (a.positional.empty() || a.positional.size() > 3) template_error("range expected 1 to 3 arguments");
    int64_t start = 0, stop, step = 1;
    if (a.positional.size() == 1) {
      stop = method_int_arg(a.positional[0], 0);
    } else {
      start = method_int_arg(a.positional[0], 0);
      stop = method_int_arg(a.positional[1], 0);
      if (a.positional.size() == 3) step = method_int_arg(a.positional[2], 1);
    }
    if (step == 0) template_error("range() arg 3 must not be zero");
    // Same bound as jinja2's sandbox (MAX_RANGE).
    __int128 count = step > 0 ? (__int128(stop) - start + step - 1) / step : (__int128(start) - stop - step - 1) / -step;
    if (count > 100000) template_error("range too big: the sandbox blocks ranges larger than 100000");
    in.check_items(size_t(count > 0 ? count : 0));
    List out;
    for (__int128 i = 0; i < count; ++i) out.push_back(Value::from_int(int64_t(start + i * step)));
    in.charge(out.size() * 16);
    return Value::from_list(std::move(out));
  }));
  g.emplace_back("namespace", Value::function("namespace", [&in](CallArgs& a) {
    Value ns = in.new_namespace();
    for (const Value& init : a.positional) {
      if (init.kind != Kind::Dict) template_error("namespace() positional argument must be a dict");
      for (const auto& [k, v] : init.dict->entries) ns.dict->set(k, v);
    }
    for (const auto& [k, v] : a.named) ns.dict->set(k, v);
    return ns;
  }));
  g.emplace_back("dict", Value::function("dict", [](CallArgs& a) {
    Dict d;
    for (const Value& init : a.positional) {
      if (init.kind != Kind::Dict) template_error("dict() positional argument must be a dict");
      for (const auto& [k, v] : init.dict->entries) d.set(k, v);
    }
    for (const auto& [k, v] : a.named) d.set(k, v);
    return Value::from_dict(std::move(d));
  }));
  g.emplace_back("raise_exception", Value::function("raise_exception", [](CallArgs& a) -> Value {
    throw TemplateRaised{to_str(a.get(0, "message"))};
  }));
  g.emplace_back("strftime_now", Value::function("strftime_now", [](CallArgs& a) {
    Value format = a.get(0, "format");
    if (!format.is_string()) template_error("strftime_now() needs a format string");
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, format.str.c_str(), &local);
    return Value::from_string(std::string(buf, n));
  }));
  return g;
}

}  // namespace ellm::jinja
