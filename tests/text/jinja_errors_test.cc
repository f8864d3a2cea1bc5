// Bad templates and hostile inputs: each fails with a clear one-line error naming the line,
// and nothing can crash, hang or exhaust memory.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/jinja/jinja.h"

namespace ellm::jinja {
namespace {

// Renders `source` and returns the error message, or "no error: <output>".
std::string error_of(const std::string& source, const Limits& limits = {}) {
  try {
    return "no error: " + Template::parse(source, "t.jinja").render(nlohmann::ordered_json{{"n", 3}}, limits);
  } catch (const Error& e) {
    return e.what();
  }
}

TEST(JinjaErrors, UnknownFilterFailsAtLoadWithItsLine) {
  EXPECT_EQ(error_of("line one\n{{ 'x' | nope }}"), "t.jinja:2: unknown filter 'nope'");
  EXPECT_EQ(error_of("{{ 1 is nope }}"), "t.jinja:1: unknown test 'nope'");
}

TEST(JinjaErrors, UnknownFilterInsideIfFailsOnlyWhenReached) {
  // jinja2 defers these, so a template may guard optional filters with `is filter`.
  EXPECT_EQ(error_of("{% if false %}{{ 1 | nope }}{% endif %}ok"), "no error: ok");
  EXPECT_EQ(error_of("{% if true %}\n{{ 1 | nope }}{% endif %}"), "t.jinja:2: unknown filter 'nope'");
  EXPECT_EQ(error_of("{{ 'nope' is filter }} {{ 'trim' is filter }}"), "no error: False True");
}

TEST(JinjaErrors, RaiseExceptionCarriesExactlyTheMessage) {
  EXPECT_EQ(error_of("{{ raise_exception('Conversation roles must alternate') }}"),
            "Conversation roles must alternate");
  EXPECT_EQ(error_of("{% if n > 2 %}{{ raise_exception('n is ' ~ n) }}{% endif %}"), "n is 3");
}

TEST(JinjaErrors, UnterminatedConstructs) {
  EXPECT_EQ(error_of("ab\n{{ x"), "t.jinja:2: unterminated tag: missing '}}'");
  EXPECT_EQ(error_of("{% if true %}x"),
            "t.jinja:1: unexpected end of template: 'if' block needs 'elif' or 'else' or 'endif'");
  EXPECT_EQ(error_of("{% for x in y %}"), "t.jinja:1: unexpected end of template: 'for' block needs 'endfor' or 'else'");
  EXPECT_EQ(error_of("{# never closed"), "t.jinja:1: unterminated comment: missing '#}'");
  EXPECT_EQ(error_of("{{ 'abc }}"), "t.jinja:1: unterminated string literal");
  EXPECT_EQ(error_of("{% raw %}abc"), "t.jinja:1: unterminated 'raw' block: missing '{% endraw %}'");
  EXPECT_EQ(error_of("{{ (1 + 2 }}"), "t.jinja:1: unexpected '}'");
}

TEST(JinjaErrors, SyntaxErrors) {
  EXPECT_EQ(error_of("{{ n[:,1] }}"), "t.jinja:1: a slice cannot be part of a tuple subscript");
  EXPECT_EQ(error_of("{{ n[1, ::2] }}"), "t.jinja:1: a slice cannot be part of a tuple subscript");
  EXPECT_EQ(error_of("{% foo %}"), "t.jinja:1: unknown tag 'foo'");
  EXPECT_EQ(error_of("{% endif %}"), "t.jinja:1: unexpected 'endif' tag");
  EXPECT_EQ(error_of("{% break %}"), "t.jinja:1: 'break' outside of a loop");
  EXPECT_EQ(error_of("{{ 1 + }}"), "t.jinja:1: unexpected end of print statement '}}'");
  EXPECT_EQ(error_of("{{ ) }}"), "t.jinja:1: unexpected ')'");
  EXPECT_EQ(error_of("{{ a $ b }}"), "t.jinja:1: unexpected character '$'");
  EXPECT_EQ(error_of("{{ }}"), "t.jinja:1: expected an expression, got end of print statement '}}'");
  EXPECT_EQ(error_of("{% set 1 = 2 %}"), "t.jinja:1: expected a name, got '1'");
  EXPECT_EQ(error_of("{{ 99999999999999999999 }}"), "t.jinja:1: integer literal too large");
}

TEST(JinjaErrors, RuntimeErrorsNameTheLine) {
  EXPECT_EQ(error_of("\n\n{{ missing.attr }}"), "t.jinja:3: 'missing' is undefined");
  EXPECT_EQ(error_of("{{ {'a': 1}.b.c }}"), "t.jinja:1: 'dict object' has no attribute 'b'");
  EXPECT_EQ(error_of("{{ 'a' + 1 }}"), "t.jinja:1: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(error_of("{{ n / 0 }}"), "t.jinja:1: division by zero");
  EXPECT_EQ(error_of("{{ n() }}"), "t.jinja:1: 'int' object is not callable");
  EXPECT_EQ(error_of("{% for x in n %}{% endfor %}"), "t.jinja:1: 'int' object is not iterable");
  EXPECT_EQ(error_of("{{ [1] | tojson }}{{ nothing | tojson }}"),
            "t.jinja:1: Object of type Undefined is not JSON serializable");
  EXPECT_EQ(error_of("{% set a, b = [1] %}"), "t.jinja:1: not enough values to unpack (expected 2, got 1)");
  EXPECT_EQ(error_of("{% set x.y = 1 %}"), "t.jinja:1: cannot assign attribute on non-namespace object 'x'");
  EXPECT_EQ(error_of("{{ 'a'.split('') }}"), "t.jinja:1: empty separator");
  EXPECT_EQ(error_of("{{ [].append(1) }}"), "t.jinja:1: access to attribute 'append' of 'list' object is unsafe");
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}"), "t.jinja:1: integer overflow");
  EXPECT_EQ(error_of("{% macro m() %}\n{{ 1 < 'a' }}{% endmacro %}{{ m() }}"),
            "t.jinja:2: '<' not supported between instances of 'int' and 'str'");
}

TEST(JinjaErrors, DeepNestingIsRefusedNotACrash) {
  std::string parens = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_EQ(error_of(parens), "t.jinja:1: template nested too deeply");
  std::string many_nots = "{{ ";
  for (int i = 0; i < 5000; ++i) many_nots += "not ";
  EXPECT_EQ(error_of(many_nots + "1 }}"), "t.jinja:1: template nested too deeply");
  std::string minus = "{{ " + std::string(5000, '-') + "1 }}";
  EXPECT_EQ(error_of(minus), "t.jinja:1: template nested too deeply");
  std::string ifs;
  for (int i = 0; i < 500; ++i) ifs += "{% if true %}";
  EXPECT_EQ(error_of(ifs), "t.jinja:1: template nested too deeply");
  std::string lists = "{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}";
  EXPECT_EQ(error_of(lists), "t.jinja:1: template nested too deeply");
}

TEST(JinjaErrors, EndlessRecursionAndLoopsStop) {
  EXPECT_EQ(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), "t.jinja:1: template recursion too deep");
  Limits small;
  small.max_steps = 1'000'000;
  EXPECT_EQ(error_of("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", small),
            "t.jinja:1: template exceeded its step budget (endless loop?)");
  EXPECT_EQ(error_of("{{ range(100001) }}"),
            "t.jinja:1: range too big: the sandbox blocks ranges larger than 100000");
}

TEST(JinjaErrors, OutputAndValuesStayWithinTheSizeLimit) {
  Limits small;
  small.max_output_bytes = 1 << 20;
  small.max_list_items = 1000;
  EXPECT_EQ(error_of("{{ 'x' * 2000000 }}", small), "t.jinja:1: string of 2000000 bytes exceeds the limit of 1048576");
  EXPECT_EQ(error_of("{% set ns = namespace(s='xx') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                     small),
            "t.jinja:1: string of 2097152 bytes exceeds the limit of 1048576");
  EXPECT_EQ(error_of("{{ [1] * 5000 }}", small), "t.jinja:1: list of 5000 items exceeds the limit of 1000");
  EXPECT_EQ(error_of("{% for i in range(1000) %}{{ 'y' * 2000 }}{% endfor %}", small),
            "t.jinja:1: string of 1050000 bytes exceeds the limit of 1048576");
}

TEST(JinjaErrors, SelfReferencesAndEscapedMacrosAreSafe) {
  // A namespace holding itself, and a macro outliving the loop that defined it (it no longer
  // sees the loop's variables; jinja2 itself renders nonsense here).
  EXPECT_EQ(error_of("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me is defined }}"), "no error: True");
  EXPECT_EQ(error_of("{% set ns = namespace() %}{% for i in [7] %}{% macro m() %}{{ i }}{% endmacro %}"
                     "{% set ns.m = m %}{% endfor %}[{{ ns.m() }}]"),
            "no error: []");
}

TEST(JinjaErrors, ContextMustBeAnObject) {
  Template t = Template::parse("x", "t.jinja");
  EXPECT_THROW(t.render(nlohmann::ordered_json::array()), Error);
}

}  // namespace
}  // namespace ellm::jinja
