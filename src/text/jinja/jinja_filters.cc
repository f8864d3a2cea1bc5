// Filters: jinja2's builtins that chat templates use, and Hugging Face's tojson
// (json.dumps with ensure_ascii=False, no HTML escaping). Filters that return generators
// in Python (reverse, map, select, items...) return lists here; templates pass them on to
// `list`, `join` or a loop, where the result is the same.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "text/jinja/jinja_interp.h"
#include "text/jinja/jinja_strings.h"

namespace ellm::jinja {
namespace {

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);

int64_t filter_int_arg(const Value& v, int64_t fallback) {
  if (v.is_undefined() || v.is_none()) return fallback;
  if (v.kind == Kind::Int) return v.integer;
  if (v.kind == Kind::Bool) return v.boolean;
  template_error("expected an integer argument, got " + type_name(v));
}

std::string string_arg(const Value& v, const std::string& fallback) {
  return v.is_undefined() ? fallback : to_str(v);
}

// "a.b.0" -> value["a"]["b"][0], as jinja2's attribute= parameters read it.
Value lookup_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (cur.is_undefined()) return cur;
    cur = numeric && part.size() < 18 ? get_item(cur, Value::from_int(std::stoll(part))) : get_item(cur, Value::from_string(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// Arguments after the first `skip` positional ones, for filters that forward to a test/filter.
CallArgs rest_args(const CallArgs& args, size_t skip) {
  CallArgs rest;
  for (size_t i = skip; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  return rest;
}

Value f_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  JsonOptions options;
  options.ensure_ascii = truthy(a.get(0, "ensure_ascii"));
  options.indent = int(std::clamp<int64_t>(filter_int_arg(a.get(1, "indent"), -1), -1, 64));
  Value separators = a.get(2, "separators");
  if (separators.kind == Kind::List && separators.list->size() == 2) {
    options.item_separator = to_str((*separators.list)[0]);
    options.key_separator = to_str((*separators.list)[1]);
  }
  options.sort_keys = truthy(a.get(3, "sort_keys"));
  std::string json = to_json(v, options);
  in.charge(json.size());
  in.check_size(json.size());
  return Value::from_string(std::move(json));
}

Value f_string(Interpreter& in, const Value& v, CallArgs&) {
  std::string s = to_str(v);
  in.charge(s.size());
  return Value::from_string(std::move(s));
}

Value f_trim(Interpreter&, const Value& v, CallArgs& a) {
  Value chars = a.get(0, "chars");
  std::string chars_str = chars.is_undefined() || chars.is_none() ? "" : to_str(chars);
  return Value::from_string(py_strip(to_str(v), chars.is_undefined() || chars.is_none() ? nullptr : &chars_str, true, true));
}

Value f_length(Interpreter&, const Value& v, CallArgs&) { return Value::from_int(int64_t(length(v))); }

Value f_items(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::from_list({});
  if (v.kind != Kind::Dict) template_error("can only get item pairs from a mapping");
  List out;
  for (const auto& [k, e] : v.dict->entries) out.push_back(Value::tuple({Value::from_string(k), e}));
  return Value::from_list(std::move(out));
}

Value f_lower(Interpreter&, const Value& v, CallArgs&) { return Value::from_string(py_lower(to_str(v))); }
Value f_upper(Interpreter&, const Value& v, CallArgs&) { return Value::from_string(py_upper(to_str(v))); }
Value f_title(Interpreter&, const Value& v, CallArgs&) { return Value::from_string(py_title(to_str(v))); }
Value f_capitalize(Interpreter&, const Value& v, CallArgs&) { return Value::from_string(py_capitalize(to_str(v))); }

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  std::string sep = string_arg(a.get(0, "d"), "");
  Value attribute = a.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += sep;
    out += to_str(attribute.is_undefined() ? item : lookup_path(item, to_str(attribute)));
    first = false;
    in.check_size(out.size());
  }
  in.charge(out.size());
  return Value::from_string(std::move(out));
}

Value f_first(Interpreter&, const Value& v, CallArgs&) {
  List items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Interpreter&, const Value& v, CallArgs&) {
  if (v.kind == Kind::Dict) template_error("'dict' object is not reversible");
  List items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  bool use_default = v.is_undefined() || (truthy(a.get(1, "boolean")) && !truthy(v));
  if (!use_default) return v;
  Value fallback = a.get(0, "default_value");
  return fallback.is_undefined() ? Value::from_string("") : fallback;
}

Value f_list(Interpreter&, const Value& v, CallArgs&) { return Value::from_list(iterate(v)); }
Value f_safe(Interpreter&, const Value& v, CallArgs&) { return v; }

Value f_escape(Interpreter&, const Value& v, CallArgs&) {
  std::string out;
  for (char c : to_str(v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value::from_string(std::move(out));
}

// Python's int(str): optional sign, digits with single underscores, surrounding whitespace.
bool parse_int(const std::string& text, int64_t base, int64_t& out) {
  std::string s = py_strip(text, nullptr, true, true), digits;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] != '_') digits += s[i];
  if (digits.empty() || base < 2 || base > 36) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(digits.c_str(), &end, int(base));
  if (errno || *end) return false;
  out = v;
  return true;
}

bool parse_float(const std::string& text, double& out) {
  std::string s = py_strip(text, nullptr, true, true);
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return *end == 0;
}

Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  Value fallback = a.get(0, "default");
  int64_t base = filter_int_arg(a.get(1, "base"), 10);
  switch (v.kind) {
    case Kind::Int: return v;
    case Kind::Bool: return Value::from_int(v.boolean);
    case Kind::Float:
      if (std::isfinite(v.real) && std::fabs(v.real) < 9.2e18) return Value::from_int(int64_t(v.real));
      break;
    case Kind::String: {
      int64_t i;
      if (parse_int(v.str, base, i)) return Value::from_int(i);
      double d;
      if (parse_float(v.str, d) && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::from_int(int64_t(d));
      break;
    }
    default: break;
  }
  return fallback.is_undefined() ? Value::from_int(0) : fallback;
}

Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  Value fallback = a.get(0, "default");
  if (v.is_number()) return Value::from_float(v.kind == Kind::Float ? v.real : double(v.kind == Kind::Bool ? v.boolean : v.integer));
  double d;
  if (v.is_string() && parse_float(v.str, d)) return Value::from_float(d);
  return fallback.is_undefined() ? Value::from_float(0) : fallback;
}

Value f_abs(Interpreter&, const Value& v, CallArgs&) {
  if (v.kind == Kind::Float) return Value::from_float(std::fabs(v.real));
  if (v.kind == Kind::Int && v.integer != INT64_MIN) return Value::from_int(v.integer < 0 ? -v.integer : v.integer);
  if (v.kind == Kind::Bool) return Value::from_int(v.boolean);
  template_error("bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_reverse(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_string()) {
    std::vector<std::string_view> chars = split_codepoints(v.str);
    std::string out;
    for (size_t i = chars.size(); i-- > 0;) out += chars[i];
    return Value::from_string(std::move(out));
  }
  List items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::from_list(std::move(items));
}

Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  List out;
  Value attribute = a.get(size_t(-1), "attribute");
  if (!attribute.is_undefined()) {
    Value fallback = a.get(size_t(-1), "default");
    for (const Value& item : iterate(v)) {
      Value r = lookup_path(item, to_str(attribute));
      out.push_back(r.is_undefined() && !fallback.is_undefined() ? fallback : r);
    }
  } else {
    if (a.positional.empty() || !a.positional[0].is_string()) template_error("map() needs a filter name or attribute=");
    const std::string name = a.positional[0].str;
    if (!is_known_filter(name)) template_error("unknown filter '" + name + "'");
    for (const Value& item : iterate(v)) {
      CallArgs rest = rest_args(a, 1);
      out.push_back(in.filter(name, item, rest));
    }
  }
  return Value::from_list(std::move(out));
}

// select / reject / selectattr / rejectattr
Value select_items(Interpreter& in, const Value& v, CallArgs& a, bool keep, bool by_attribute) {
  size_t skip = by_attribute ? 1 : 0;
  std::string attribute = by_attribute ? to_str(a.get(0, "attribute")) : "";
  bool has_test = a.positional.size() > skip;
  std::string test = has_test ? to_str(a.positional[skip]) : "";
  if (has_test && !is_known_test(test)) template_error("unknown test '" + test + "'");
  List out;
  for (const Value& item : iterate(v)) {
    Value subject = by_attribute ? lookup_path(item, attribute) : item;
    CallArgs rest = rest_args(a, skip + 1);
    bool passed = has_test ? in.test(test, subject, rest) : truthy(subject);
    if (passed == keep) out.push_back(item);
  }
  return Value::from_list(std::move(out));
}
Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_items(in, v, a, true, false); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_items(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_items(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_items(in, v, a, false, true); }

// Sort key: strings compare case-insensitively unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return v.is_string() && !case_sensitive ? Value::from_string(py_lower(v.str)) : v;
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& a) {
  bool reverse = truthy(a.get(0, "reverse"));
  bool case_sensitive = truthy(a.get(1, "case_sensitive"));
  Value attribute = a.get(2, "attribute");
  List items = iterate(v);
  in.charge(items.size() * 16);
  auto key = [&](const Value& item) {
    return sort_key(attribute.is_undefined() ? item : lookup_path(item, to_str(attribute)), case_sensitive);
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? compare(key(y), key(x)) < 0 : compare(key(x), key(y)) < 0;
  });
  return Value::from_list(std::move(items));
}

Value f_dictsort(Interpreter&, const Value& v, CallArgs& a) {
  if (v.kind != Kind::Dict) template_error("dictsort needs a mapping");
  bool case_sensitive = truthy(a.get(0, "case_sensitive"));
  bool by_value = to_str(a.get(1, "by")) == "value";
  bool reverse = truthy(a.get(2, "reverse"));
  List pairs;
  for (const auto& [k, e] : v.dict->entries) pairs.push_back(Value::tuple({Value::from_string(k), e}));
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    const Value& kx = (*x.list)[by_value], &ky = (*y.list)[by_value];
    int c = compare(sort_key(kx, case_sensitive), sort_key(ky, case_sensitive));
    return reverse ? c > 0 : c < 0;
  });
  return Value::from_list(std::move(pairs));
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& a) {
  bool case_sensitive = truthy(a.get(0, "case_sensitive"));
  List out, seen;
  List items = iterate(v);
  in.charge(items.size() * items.size() / 8);
  for (const Value& item : items) {
    Value k = sort_key(item, case_sensitive);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
      seen.push_back(k);
      out.push_back(item);
    }
  }
  return Value::from_list(std::move(out));
}

Value min_max(const Value& v, CallArgs& a, bool want_max) {
  bool case_sensitive = truthy(a.get(0, "case_sensitive"));
  Value attribute = a.get(1, "attribute");
  List items = iterate(v);
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  auto key = [&](const Value& item) {
    return sort_key(attribute.is_undefined() ? item : lookup_path(item, to_str(attribute)), case_sensitive);
  };
  const Value* best = &items[0];
  for (const Value& item : items) {
    int c = compare(key(item), key(*best));
    if (want_max ? c > 0 : c < 0) best = &item;
  }
  return *best;
}
Value f_min(Interpreter&, const Value& v, CallArgs& a) { return min_max(v, a, false); }
Value f_max(Interpreter&, const Value& v, CallArgs& a) { return min_max(v, a, true); }

Value f_sum(Interpreter&, const Value& v, CallArgs& a) {
  Value attribute = a.get(0, "attribute");
  Value start = a.get(1, "start");
  bool is_float = start.kind == Kind::Float;
  double fsum = is_float ? start.real : 0;
  int64_t isum = start.kind == Kind::Int ? start.integer : 0;
  for (const Value& item : iterate(v)) {
    Value x = attribute.is_undefined() ? item : lookup_path(item, to_str(attribute));
    if (!x.is_number()) template_error("unsupported operand type(s) for +: 'int' and '" + type_name(x) + "'");
    if (x.kind == Kind::Float) {
      if (!is_float) fsum = double(isum);
      is_float = true;
      fsum += x.real;
    } else {
      int64_t i = x.kind == Kind::Bool ? x.boolean : x.integer;
      if (is_float) fsum += double(i);
      else if (__builtin_add_overflow(isum, i, &isum)) template_error("integer overflow");
    }
  }
  return is_float ? Value::from_float(fsum) : Value::from_int(isum);
}

Value f_round(Interpreter&, const Value& v, CallArgs& a) {
  if (!v.is_number()) template_error("round needs a number");
  int64_t precision = std::clamp<int64_t>(filter_int_arg(a.get(0, "precision"), 0), -300, 300);
  std::string method = string_arg(a.get(1, "method"), "common");
  double x = v.kind == Kind::Float ? v.real : double(v.kind == Kind::Bool ? v.boolean : v.integer);
  double scale = std::pow(10.0, double(precision));
  // Python's round() rounds halves to even; nearbyint does too in the default rounding mode.
  double r = method == "ceil" ? std::ceil(x * scale) : method == "floor" ? std::floor(x * scale) : std::nearbyint(x * scale);
  return Value::from_float(r / scale);
}

Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  std::string s = to_str(v);
  std::string from = to_str(a.get(0, "old")), to = to_str(a.get(1, "new"));
  int64_t count = filter_int_arg(a.get(2, "count"), -1);
  unsigned __int128 most_hits = from.empty() ? s.size() + 1 : s.size() / from.size();
  unsigned __int128 bound = s.size() + most_hits * to.size();
  if (bound > in.limits().max_output_bytes) in.check_size(size_t(std::min<unsigned __int128>(bound, SIZE_MAX)));
  std::string out = py_replace(s, from, to, count);
  in.charge(out.size());
  return Value::from_string(std::move(out));
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  Value width_v = a.get(0, "width");
  std::string pad = width_v.is_string() ? width_v.str : std::string(size_t(std::clamp<int64_t>(filter_int_arg(width_v, 4), 0, 256)), ' ');
  bool first = truthy(a.get(1, "first")), blank = truthy(a.get(2, "blank"));
  std::string s = to_str(v), out;
  size_t start = 0;
  bool is_first = true;
  while (true) {
    size_t nl = s.find('\n', start);
    std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    bool indent = (!is_first || first) && (blank || !py_strip(line, nullptr, true, true).empty());
    if (indent) out += pad;
    out += line;
    in.check_size(out.size());
    if (nl == std::string::npos) break;
    out += '\n';
    start = nl + 1;
    is_first = false;
  }
  return Value::from_string(std::move(out));
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs&) {
  return Value::from_int(int64_t(py_split(to_str(v), nullptr, -1).size()));
}

Value f_center(Interpreter&, const Value& v, CallArgs& a) {
  std::string s = to_str(v);
  int64_t width = std::clamp<int64_t>(filter_int_arg(a.get(0, "width"), 80), 0, 4096);
  int64_t n = int64_t(codepoint_count(s));
  if (width <= n) return Value::from_string(s);
  int64_t total = width - n, left = total / 2 + (total & width & 1);
  return Value::from_string(std::string(size_t(left), ' ') + s + std::string(size_t(total - left), ' '));
}

struct FilterEntry {
  const char* name;
  FilterFn fn;
};

const FilterEntry kFilters[] = {
    {"tojson", f_tojson},       {"string", f_string},         {"trim", f_trim},
    {"length", f_length},       {"count", f_length},          {"items", f_items},
    {"lower", f_lower},         {"upper", f_upper},           {"title", f_title},
    {"capitalize", f_capitalize}, {"join", f_join},           {"first", f_first},
    {"last", f_last},           {"default", f_default},       {"d", f_default},
    {"list", f_list},           {"safe", f_safe},             {"escape", f_escape},
    {"e", f_escape},            {"forceescape", f_escape},    {"int", f_int},
    {"float", f_float},         {"abs", f_abs},               {"reverse", f_reverse},
    {"map", f_map},             {"select", f_select},         {"reject", f_reject},
    {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr}, {"sort", f_sort},
    {"dictsort", f_dictsort},   {"unique", f_unique},         {"min", f_min},
    {"max", f_max},             {"sum", f_sum},               {"round", f_round},
    {"replace", f_replace},     {"indent", f_indent},         {"wordcount", f_wordcount},
    {"center", f_center},
};

const FilterEntry* find_filter(const std::string& name) {
  for (const FilterEntry& f : kFilters)
    if (name == f.name) return &f;
  return nullptr;
}

}  // namespace

bool is_known_filter(const std::string& name) { return find_filter(name) != nullptr; }

Value apply_filter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args) {
  const FilterEntry* f = find_filter(name);
  if (!f) template_error("unknown filter '" + name + "'");
  return f->fn(in, input, args);
}

}  // namespace ellm::jinja
