#include "text/jinja/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <utf8proc.h>

#include "text/jinja/jinja_strings.h"

namespace ellm::jinja {

void template_error(const std::string& message) { throw TemplateFailure{message, 0}; }

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value value) {
  for (auto& [k, v] : entries)
    if (k == key) {
      v = std::move(value);
      return;
    }
  entries.emplace_back(key, std::move(value));
}

Value CallArgs::get(size_t index, const std::string& name) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [k, v] : named)
    if (k == name) return v;
  return Value::undefined(name);
}

bool CallArgs::has(size_t index, const std::string& name) const {
  if (index < positional.size()) return true;
  for (const auto& [k, v] : named)
    if (k == name) return true;
  return false;
}

Value from_json(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null: return Value::none();
    case T::boolean: return Value::from_bool(j.get<bool>());
    case T::number_integer: return Value::from_int(j.get<int64_t>());
    case T::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= uint64_t(INT64_MAX)) return Value::from_int(int64_t(u));
      return Value::from_float(double(u));
    }
    case T::number_float: return Value::from_float(j.get<double>());
    case T::string: return Value::from_string(j.get<std::string>());
    case T::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return Value::from_list(std::move(items));
    }
    case T::object: {
      Dict d;
      d.entries.reserve(j.size());
      for (const auto& [k, v] : j.items()) d.entries.emplace_back(k, from_json(v));
      return Value::from_dict(std::move(d));
    }
    default: return Value::undefined();
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.boolean;
    case Kind::Int: return v.integer != 0;
    case Kind::Float: return v.real != 0;
    case Kind::String: return !v.str.empty();
    case Kind::List: return !v.list->empty();
    case Kind::Dict: return !v.dict->entries.empty();
    case Kind::Namespace:
    case Kind::Callable: return true;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Callable: return "function";
  }
  return "object";
}

// Python's repr(float): the shortest digits that round-trip, fixed notation for decimal
// exponents in [-4, 16), scientific with a two-digit exponent otherwise.
std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, end);  // "-1.2345e+05"
  bool negative = sci[0] == '-';
  size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(negative ? 1 : 0, e_pos - (negative ? 1 : 0));
  int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(size_t(-exponent - 1), '0') + digits;
    } else if (size_t(exponent) + 1 >= digits.size()) {
      out += digits + std::string(size_t(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, size_t(exponent) + 1) + "." + digits.substr(size_t(exponent) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_buf;
}

static std::string repr_string(const std::string& s) {
  char quote = '\'';
  if (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) quote = '"';
  std::string out(1, quote);
  for_each_codepoint(s, [&](char32_t cp, std::string_view bytes) {
    if (cp == '\\') out += "\\\\";
    else if (cp == char32_t(quote)) out += std::string("\\") + quote;
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (is_printable(cp)) out += bytes;
    else {
      char buf[16];
      if (cp < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(cp));
      else if (cp < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(cp));
      else std::snprintf(buf, sizeof buf, "\\U%08x", unsigned(cp));
      out += buf;
    }
  });
  return out + quote;
}

std::string to_repr(const Value& v) {
  if (v.kind == Kind::String) return repr_string(v.str);
  return to_str(v);
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return v.boolean ? "True" : "False";
    case Kind::Int: return std::to_string(v.integer);
    case Kind::Float: return python_float_repr(v.real);
    case Kind::String: return v.str;
    case Kind::List: {
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += ", ";
        out += to_repr((*v.list)[i]);
      }
      if (v.is_tuple) return out + (v.list->size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Kind::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, e] : v.dict->entries) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + to_repr(e);
      }
      return out + "}";
    }
    case Kind::Namespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [k, e] : v.dict->entries) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + to_repr(e);
      }
      return out + "}>";
    }
    case Kind::Callable: return "<function " + v.callable->name + ">";
  }
  return "";
}

static double as_double(const Value& v) {
  if (v.kind == Kind::Float) return v.real;
  if (v.kind == Kind::Bool) return v.boolean ? 1 : 0;
  return double(v.integer);
}

static bool both_numbers(const Value& a, const Value& b) { return a.is_number() && b.is_number(); }

bool equals(const Value& a, const Value& b) {
  if (both_numbers(a, b)) {
    if (a.kind != Kind::Float && b.kind != Kind::Float)
      return (a.kind == Kind::Bool ? a.boolean : a.integer) ==
             (b.kind == Kind::Bool ? b.boolean : b.integer);
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.str == b.str;
    case Kind::List: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equals((*a.list)[i], (*b.list)[i])) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.dict->entries.size() != b.dict->entries.size()) return false;
      for (const auto& [k, v] : a.dict->entries) {
        const Value* other = b.dict->find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    case Kind::Namespace: return a.dict == b.dict;
    case Kind::Callable: return a.callable == b.callable;
    default: return false;
  }
}

int compare(const Value& a, const Value& b) {
  if (both_numbers(a, b)) {
    if (a.kind == Kind::Int && b.kind == Kind::Int) return (a.integer > b.integer) - (a.integer < b.integer);
    double x = as_double(a), y = as_double(b);
    return (x > y) - (x < y);
  }
  if (a.kind == Kind::String && b.kind == Kind::String) return a.str.compare(b.str) < 0 ? -1 : a.str == b.str ? 0 : 1;
  if (a.kind == Kind::List && b.kind == Kind::List) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t i = 0; i < n; ++i)
      if (!equals((*a.list)[i], (*b.list)[i])) return compare((*a.list)[i], (*b.list)[i]);
    return (a.list->size() > b.list->size()) - (a.list->size() < b.list->size());
  }
  template_error("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

static void json_escape_byte(char byte, std::string& out);

static void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  if (ensure_ascii) {  // non-ASCII as \uXXXX, astral code points as surrogate pairs
    size_t pos = 0;
    while (pos < s.size()) {
      size_t start = pos;
      char32_t cp = next_codepoint(s, pos);
      if (cp < 0x80) {
        json_escape_byte(s[start], out);
        continue;
      }
      char buf[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", unsigned(0xD800 + (cp >> 10)), unsigned(0xDC00 + (cp & 0x3FF)));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(cp));
      }
      out += buf;
    }
    out += '"';
    return;
  }
  for (char c : s) json_escape_byte(c, out);
  out += '"';
}

static void json_escape_byte(char byte, std::string& out) {
  unsigned char c = static_cast<unsigned char>(byte);
  switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    case '\b': out += "\\b"; break;
    case '\f': out += "\\f"; break;
    default:
      if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      } else {
        out += char(c);
      }
  }
}

namespace {
struct JsonWriter {
  int indent;
  bool sort_keys;
  bool ensure_ascii;
  std::string item_sep, key_sep;
  std::string out;
  int depth = 0;

  void newline(int level) {
    if (indent < 0) return;
    out += '\n';
    out.append(size_t(indent) * size_t(level), ' ');
  }

  void write(const Value& v) {
    if (++depth > 512) template_error("tojson: value nested too deeply");
    switch (v.kind) {
      case Kind::None: out += "null"; break;
      case Kind::Bool: out += v.boolean ? "true" : "false"; break;
      case Kind::Int: out += std::to_string(v.integer); break;
      case Kind::Float:
        if (std::isnan(v.real)) out += "NaN";
        else if (std::isinf(v.real)) out += v.real < 0 ? "-Infinity" : "Infinity";
        else out += python_float_repr(v.real);
        break;
      case Kind::String: json_string(v.str, ensure_ascii, out); break;
      case Kind::List: {
        if (v.list->empty()) {
          out += "[]";
          break;
        }
        out += '[';
        for (size_t i = 0; i < v.list->size(); ++i) {
          if (i) out += item_sep;
          newline(depth);
          write((*v.list)[i]);
        }
        newline(depth - 1);
        out += ']';
        break;
      }
      case Kind::Dict: {
        if (v.dict->entries.empty()) {
          out += "{}";
          break;
        }
        std::vector<const std::pair<std::string, Value>*> entries;
        for (const auto& e : v.dict->entries) entries.push_back(&e);
        if (sort_keys)
          std::stable_sort(entries.begin(), entries.end(), [](auto* x, auto* y) { return x->first < y->first; });
        out += '{';
        for (size_t i = 0; i < entries.size(); ++i) {
          if (i) out += item_sep;
          newline(depth);
          json_string(entries[i]->first, ensure_ascii, out);
          out += key_sep;
          write(entries[i]->second);
        }
        newline(depth - 1);
        out += '}';
        break;
      }
      default: template_error("Object of type " + type_name(v) + " is not JSON serializable");
    }
    --depth;
  }
};
}  // namespace

std::string to_json(const Value& v, const JsonOptions& options) {
  JsonWriter w{options.indent, options.sort_keys, options.ensure_ascii, options.item_separator,
               options.key_separator, {}};
  if (w.item_sep.empty()) w.item_sep = w.indent >= 0 ? "," : ", ";
  if (w.key_sep.empty()) w.key_sep = ": ";
  w.write(v);
  return std::move(w.out);
}

}  // namespace ellm::jinja
