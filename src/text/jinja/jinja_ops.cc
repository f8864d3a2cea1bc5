// Arithmetic and concatenation with Python's semantics (int/float promotion, floor division
// and modulo rounding toward negative infinity, str/list repetition). Python integers are
// unbounded; here they are 64-bit and overflow is an error rather than a wrong answer.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "text/jinja/jinja_interp.h"

namespace ellm::jinja {
namespace {

bool is_int(const Value& v) { return v.kind == Kind::Int || v.kind == Kind::Bool; }
int64_t as_int(const Value& v) { return v.kind == Kind::Bool ? v.boolean : v.integer; }
double as_double(const Value& v) { return v.kind == Kind::Float ? v.real : double(as_int(v)); }

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  template_error("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

[[noreturn]] void overflow() { template_error("integer overflow"); }

Value repeat(Interpreter& in, const Value& seq, int64_t times) {
  if (times < 0) times = 0;
  if (seq.kind == Kind::String && seq.str.empty()) return seq;
  if (seq.kind == Kind::List && seq.list->empty()) return seq;
  if (seq.kind == Kind::String) {
    unsigned __int128 bytes = (unsigned __int128)seq.str.size() * uint64_t(times);
    in.check_size(size_t(std::min<unsigned __int128>(bytes, SIZE_MAX)));
    in.charge(seq.str.size() * size_t(times));
    std::string out;
    out.reserve(seq.str.size() * size_t(times));
    for (int64_t i = 0; i < times; ++i) out += seq.str;
    return Value::from_string(std::move(out));
  }
  unsigned __int128 items = (unsigned __int128)seq.list->size() * uint64_t(times);
  in.check_items(size_t(std::min<unsigned __int128>(items, SIZE_MAX)));
  in.charge(seq.list->size() * size_t(times) * 16);
  List out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return Value::from_list(std::move(out));
}

Value int_pow(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1)
      if (__builtin_mul_overflow(result, base, &result)) overflow();
    exp >>= 1;
    if (exp && __builtin_mul_overflow(base, base, &base)) overflow();
  }
  return Value::from_int(result);
}

}  // namespace

Value Interpreter::eval_binary(const Expr& e) {
  Value a = eval(*e.left);
  Value b = eval(*e.right);
  const std::string& op = e.name;
  if (op == "~") {
    std::string s = to_str(a);
    std::string t = to_str(b);
    check_size(s.size() + t.size());
    charge(s.size() + t.size());
    return Value::from_string(s + t);
  }
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  const bool ints = is_int(a) && is_int(b);
  const bool numbers = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(as_int(a), as_int(b), &r)) overflow();
      return Value::from_int(r);
    }
    if (numbers) return Value::from_float(as_double(a) + as_double(b));
    if (a.kind == Kind::String && b.kind == Kind::String) {
      check_size(a.str.size() + b.str.size());
      charge(a.str.size() + b.str.size());
      return Value::from_string(a.str + b.str);
    }
    if (a.kind == Kind::List && b.kind == Kind::List) {
      check_items(a.list->size() + b.list->size());
      charge((a.list->size() + b.list->size()) * 16);
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::from_list(std::move(out));
    }
    if (a.kind == Kind::String)
      template_error("can only concatenate str (not \"" + type_name(b) + "\") to str");
    unsupported("+", a, b);
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(as_int(a), as_int(b), &r)) overflow();
      return Value::from_int(r);
    }
    if (numbers) return Value::from_float(as_double(a) - as_double(b));
    unsupported("-", a, b);
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(as_int(a), as_int(b), &r)) overflow();
      return Value::from_int(r);
    }
    if (numbers) return Value::from_float(as_double(a) * as_double(b));
    if ((a.kind == Kind::String || a.kind == Kind::List) && is_int(b)) return repeat(*this, a, as_int(b));
    if ((b.kind == Kind::String || b.kind == Kind::List) && is_int(a)) return repeat(*this, b, as_int(a));
    unsupported("*", a, b);
  }
  if (op == "/") {
    if (!numbers) unsupported("/", a, b);
    if (as_double(b) == 0) template_error("division by zero");
    return Value::from_float(as_double(a) / as_double(b));
  }
  if (op == "//" || op == "%") {
    if (!numbers) {
      if (op == "%" && a.kind == Kind::String) template_error("printf-style '%' string formatting is not supported");
      unsupported(op, a, b);
    }
    if (ints) {
      int64_t x = as_int(a), y = as_int(b);
      if (y == 0) template_error(op == "%" ? "integer modulo by zero" : "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) {
        if (op == "%") return Value::from_int(0);
        overflow();
      }
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        q -= 1;
        r += y;
      }
      return Value::from_int(op == "//" ? q : r);
    }
    double x = as_double(a), y = as_double(b);
    if (y == 0) template_error("float division by zero");
    if (op == "//") return Value::from_float(std::floor(x / y));
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::from_float(r);
  }
  if (op == "**") {
    if (!numbers) unsupported("**", a, b);
    if (ints && as_int(b) >= 0) return int_pow(as_int(a), as_int(b));
    if (as_double(a) == 0 && as_double(b) < 0) template_error("0.0 cannot be raised to a negative power");
    return Value::from_float(std::pow(as_double(a), as_double(b)));
  }
  template_error("unknown operator '" + op + "'");
}

}  // namespace ellm::jinja
