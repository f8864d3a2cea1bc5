// The schema compiler, the byte matcher and the token mask (engine/json_schema.h,
// grammar_matcher.h, token_mask.h) over the real Qwen3 vocabulary.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "text/tokenizer/tokenizer.h"

namespace ellm {
namespace {

using nlohmann::json;

bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g.get());
  return m.feed(text.data(), text.size()) && m.feed(kEndOfOutput);
}

std::shared_ptr<const Grammar> schema(const char* text) { return compile_json_schema(json::parse(text)); }

// The real Qwen3 vocabulary, as the tiny models ship it.
const std::shared_ptr<const VocabIndex>& vocab() {
  static auto v = std::make_shared<const VocabIndex>(*Tokenizer::load(ELLM_SHARED "/models/tiny-qwen3"));
  return v;
}

TEST(JsonSchema, ObjectsWithRequiredAndOptionalProperties) {
  auto g = schema(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},
                      "required":["name"]})");
  EXPECT_TRUE(accepts(g, R"({"name":"Ann"})"));
  EXPECT_TRUE(accepts(g, R"({"name": "Ann", "age": 42})"));
  EXPECT_TRUE(accepts(g, R"({"age":-7,"name":"\u00e9\n"})"));
  EXPECT_FALSE(accepts(g, R"({"age":42})"));               // required missing
  EXPECT_FALSE(accepts(g, R"({"name":"a","name":"b"})"));  // duplicate
  EXPECT_FALSE(accepts(g, R"({"name":"a","x":1})"));       // no additional properties
  EXPECT_FALSE(accepts(g, R"({"name":"a","age":4.5})"));   // integer
  EXPECT_FALSE(accepts(g, R"({"name":"a"} )"));            // nothing after the value
  EXPECT_FALSE(accepts(g, R"({ "name":"a"})"));            // whitespace only after ':' and ','
  EXPECT_FALSE(accepts(g, R"({"name":"a")"));              // unfinished
}

TEST(JsonSchema, TypesEnumsConstArraysAndNumbers) {
  auto g = schema(R"({"type":["string","null","number"]})");
  EXPECT_TRUE(accepts(g, "null"));
  EXPECT_TRUE(accepts(g, "\"x\""));
  EXPECT_TRUE(accepts(g, "-0.25"));
  EXPECT_TRUE(accepts(g, "12"));
  EXPECT_FALSE(accepts(g, "true"));
  EXPECT_FALSE(accepts(g, "012"));
  EXPECT_FALSE(accepts(g, "1."));
  auto e = schema(R"({"enum":["red","green",1,12,null,{"a":[1]}]})");
  for (const char* ok : {"\"red\"", "\"green\"", "1", "12", "null", "{\"a\":[1]}"}) EXPECT_TRUE(accepts(e, ok)) << ok;
  for (const char* bad : {"\"re\"", "\"blue\"", "2", "123", "{\"a\":[2]}"}) EXPECT_FALSE(accepts(e, bad)) << bad;
  EXPECT_TRUE(accepts(schema(R"({"const":"only"})"), "\"only\""));
  auto a = schema(R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":3})");
  EXPECT_TRUE(accepts(a, "[true]"));
  EXPECT_TRUE(accepts(a, "[true, false,true]"));
  EXPECT_FALSE(accepts(a, "[]"));
  EXPECT_FALSE(accepts(a, "[true,true,true,true]"));
  EXPECT_FALSE(accepts(a, "[1]"));
}

TEST(JsonSchema, StringLengthsAndPatterns) {
  auto g = schema(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_FALSE(accepts(g, "\"a\""));
  EXPECT_TRUE(accepts(g, "\"ab\""));
  EXPECT_TRUE(accepts(g, "\"\xc3\xa9\xc3\xa9\xc3\xa9\""));  // three characters, six bytes
  EXPECT_FALSE(accepts(g, "\"abcd\""));
  EXPECT_FALSE(accepts(g, "\"a\xc3\""));                     // broken UTF-8
  auto p = schema(R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}(x|yz)?$"})");
  EXPECT_TRUE(accepts(p, "\"AB-123\""));
  EXPECT_TRUE(accepts(p, "\"AB-123yz\""));
  EXPECT_FALSE(accepts(p, "\"AB-123y\""));
  EXPECT_FALSE(accepts(p, "\"A-123\""));
  EXPECT_FALSE(accepts(p, "\"ab-123\""));
}

std::pair<std::string, bool> refusal(const char* text, bool strict);

// An integer's bounds hold digit by digit: a prefix that no more digits can bring within them is
// refused, and the matcher knows the fewest digits that get there.
TEST(JsonSchema, IntegerBounds) {
  auto g = schema(R"({"type":"integer","minimum":-12,"maximum":250})");
  for (const char* ok : {"-12", "-1", "0", "-0", "7", "99", "250"}) EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {"-13", "-120", "251", "1000", "2500", "1.5"}) EXPECT_FALSE(accepts(g, bad)) << bad;
  auto far = schema(R"({"type":["integer","null"],"exclusiveMinimum":999.5,"maximum":1000000})");
  EXPECT_FALSE(accepts(far, "999"));
  EXPECT_TRUE(accepts(far, "1000"));
  EXPECT_TRUE(accepts(far, "null"));
  EXPECT_FALSE(accepts(far, "1000001"));
  GrammarMatcher m(far.get());
  EXPECT_EQ(m.min_bytes(), 4);  // null, or 1000
  m.feed("5", 1);
  EXPECT_EQ(m.min_bytes(), 3);  // 5000
  EXPECT_FALSE(GrammarMatcher(far.get()).feed("-", 1));
  auto draft4 = schema(R"({"type":"integer","minimum":0,"exclusiveMinimum":true,"maximum":3,"exclusiveMaximum":true})");
  EXPECT_FALSE(accepts(draft4, "0"));
  EXPECT_TRUE(accepts(draft4, "1"));
  EXPECT_TRUE(accepts(draft4, "2"));
  EXPECT_FALSE(accepts(draft4, "3"));
  auto negative = schema(R"({"type":"integer","maximum":-40})");
  GrammarMatcher n(negative.get());
  EXPECT_EQ(n.min_bytes(), 3);  // -40
  EXPECT_FALSE(GrammarMatcher(negative.get()).feed("4", 1));
  EXPECT_TRUE(accepts(negative, "-123456789012345"));
}

// minLength beside a pattern: the output matches the pattern and is long enough, and the matcher
// knows the fewest bytes that get there from each state.
TEST(JsonSchema, PatternWithMinAndMaxLength) {
  auto g = schema(R"({"type":"string","pattern":"^[a-z]+(-[0-9]{2})*$","minLength":7,"maxLength":10})");
  EXPECT_TRUE(accepts(g, "\"abcdefg\""));
  EXPECT_TRUE(accepts(g, "\"ab-12-34\""));
  EXPECT_FALSE(accepts(g, "\"ab-12\""));        // too short
  EXPECT_FALSE(accepts(g, "\"abcdefghijk\""));  // too long
  EXPECT_FALSE(accepts(g, "\"ab-1234\""));      // not the pattern
  GrammarMatcher m(g.get());
  EXPECT_EQ(m.min_bytes(), 9);  // quote, seven characters, quote
  m.feed("\"ab-1", 5);
  EXPECT_EQ(m.min_bytes(), 5);  // "ab-12" is too short: "2-00" and the quote
  m.feed("2", 1);
  EXPECT_EQ(m.min_bytes(), 4);  // "-00" and the quote
  m.feed("-00", 3);
  EXPECT_EQ(m.min_bytes(), 1);  // long enough: the quote
  EXPECT_EQ(refusal(R"({"type":"string","pattern":"^[a-z]{2}$","minLength":3})", false).first, "minLength");
  EXPECT_EQ(refusal(R"({"type":"string","pattern":"^[a-z]{2,}$","minLength":5,"maxLength":4})", false).first, "maxLength");
}


// A pattern position a string cannot carry unescaped (DEL, '"') is one no output reaches: the
// fewest bytes to the end go around it (found by fuzz_json_schema: the budget counted on a DEL).
TEST(JsonSchema, PatternBytesAStringCannotCarryAreNeverCountedOn) {
  auto g = schema("{\"type\":\"string\",\"pattern\":\"^a(\x7f|bcd)$\"}");
  GrammarMatcher m(g.get());
  EXPECT_EQ(m.min_bytes(), 6);  // "abcd": the one-character way through DEL is not there
  EXPECT_FALSE(accepts(g, "\"a\x7f\""));
  EXPECT_TRUE(accepts(g, "\"abcd\""));
  EXPECT_EQ(refusal(R"({"type":"string","pattern":"^\\\"$"})", true).first, "pattern");  // only a quote matches
}

// A byte the pattern allows is refused when no string on from it meets minLength too: after
// "aa", "-" leaves "-dd=" at most, 6 characters against 7 (the fuzzer's case: "ab-12" was taken,
// then nothing could finish it). From every state reached, some byte brings the end one closer.
TEST(JsonSchema, PatternBytesThatCannotMeetTheLengthsAreRefused) {
  auto g = schema(R"({"type":"string","pattern":"^[a-z]+(-[0-9]{2})=$","minLength":7,"maxLength":12})");
  EXPECT_FALSE(accepts(g, "\"ab-12=\""));
  EXPECT_TRUE(accepts(g, "\"abc-12=\""));
  EXPECT_TRUE(accepts(g, "\"abcdefgh-12=\""));
  EXPECT_FALSE(accepts(g, "\"abcdefghi-12=\""));  // 13 characters
  GrammarMatcher m(g.get());
  EXPECT_TRUE(m.feed("\"aa", 3));
  GrammarMatcher dash;
  dash.copy_from(m);
  EXPECT_FALSE(dash.feed('-'));
  EXPECT_TRUE(m.feed('a'));
  for (int64_t need = m.min_bytes(); need > 0; need = m.min_bytes()) {
    GrammarMatcher next;
    bool closer = false;
    for (int b = 0; b < 256 && !closer; ++b) {
      next.copy_from(m);
      closer = next.feed(b) && next.min_bytes() == need - 1;
    }
    ASSERT_TRUE(closer) << "at " << need << " bytes from the end";
    m.copy_from(next);
  }
  EXPECT_TRUE(m.can_end());
}

TEST(JsonSchema, AnyOfRefsAndRecursion) {
  auto g = schema(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
                        "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},
                      "$ref":"#/$defs/node"})");
  EXPECT_TRUE(accepts(g, R"({"v":1,"next":null})"));
  EXPECT_TRUE(accepts(g, R"({"v":1,"next":{"v":2,"next":null}})"));
  EXPECT_FALSE(accepts(g, R"({"v":1,"next":{"v":2}})"));
  auto o = schema(R"({"anyOf":[{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]},
                               {"type":"object","properties":{"b":{"type":"integer"}},"required":["b"]}]})");
  EXPECT_TRUE(accepts(o, R"({"a":"x"})"));
  EXPECT_TRUE(accepts(o, R"({"b":3})"));
  EXPECT_FALSE(accepts(o, R"({"a":3})"));
  EXPECT_FALSE(accepts(o, R"({})"));
}

TEST(JsonSchema, ErrorsNameTheKeyword) {
  auto keyword_of = [](const char* text) {
    try {
      compile_json_schema(json::parse(text));
    } catch (const SchemaError& e) {
      return e.keyword;
    }
    return std::string("none");
  };
  EXPECT_EQ(keyword_of(R"({"type":"number","minimum":3})"), "minimum");
  EXPECT_EQ(keyword_of(R"({"type":"strin"})"), "type");
  EXPECT_EQ(keyword_of(R"({"$ref":"#/components/x"})"), "$ref");
  EXPECT_EQ(keyword_of(R"({"type":"string","pattern":"(a"})"), "pattern");
  EXPECT_EQ(keyword_of(R"j({"type":"string","pattern":"a(?=b)"})j"), "pattern");
  EXPECT_EQ(keyword_of(R"({"type":"array","prefixItems":[]})"), "prefixItems");
  EXPECT_EQ(keyword_of(R"({"type":"object","properties":{"a":{}},"required":["b"]})"), "required");
  EXPECT_EQ(keyword_of(R"({"type":"string","minLength":3,"maxLength":2})"), "maxLength");
  EXPECT_EQ(keyword_of(R"({"$defs":{"a":{"type":"object","properties":{"x":{"$ref":"#/$defs/a"}},"required":["x"]}},
                           "$ref":"#/$defs/a"})"), "$ref");  // no finite instance
  EXPECT_EQ(keyword_of(R"({"type":"object","title":"t","description":"d","properties":{}})"), "none");
  EXPECT_EQ(keyword_of(R"({"":{},"type":"string"})"), "\"\"");  // an empty key is named too (fuzz_json_schema)
}

// The keyword a schema is refused for ("none" when it compiles), and whether it is a keyword the
// compiler cannot enforce (rather than a malformed schema).
std::pair<std::string, bool> refusal(const char* text, bool strict) {
  try {
    compile_json_schema(json::parse(text), strict);
  } catch (const SchemaError& e) {
    return {e.keyword, e.unsupported};
  }
  return {"none", false};
}

// Not strict, what only narrows the accepted values and cannot be enforced is ignored, and so
// are unknown keywords; strict refuses them, naming the keyword.
TEST(JsonSchema, NotStrictIgnoresWhatCannotBeEnforced) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"({"type":"number","minimum":3})", "minimum"},
      {R"({"type":"number","exclusiveMaximum":1.5,"multipleOf":0.5})", "exclusiveMaximum"},
      {R"({"type":"array","items":{"type":"string"},"uniqueItems":true})", "uniqueItems"},
      {R"({"type":"object","minProperties":1,"patternProperties":{"^x":{}}})", "minProperties"},
      {R"({"not":{"type":"null"}})", "not"},
      {R"({"if":{"type":"string"},"then":{"minLength":2}})", "if"},
      {R"({"type":"array","prefixItems":[{"type":"integer"}]})", "prefixItems"},
      {R"({"type":"array","items":[{"type":"integer"}]})", "items"},
      {R"({"allOf":[{"type":"integer"},{"type":"number"}]})", "allOf"},
      {R"({"$defs":{"n":{"type":"integer"}},"$ref":"#/$defs/n","type":"integer"})", "$ref"},
      {R"j({"type":"string","pattern":"a(?=b)"})j", "pattern"},
      {R"({"type":"string","pattern":"[a-z]+","minLength":2000})", "minLength"},
      {R"({"type":"string","x-vendor-hint":true})", "x-vendor-hint"},
  };
  for (const auto& [text, keyword] : cases) {
    EXPECT_EQ(refusal(text, true), std::make_pair(std::string(keyword), true)) << text;
    EXPECT_EQ(refusal(text, false).first, "none") << text;
  }
  // The output follows the schema without those keywords.
  auto lenient = [](const char* text) { return compile_json_schema(json::parse(text), false); };
  auto bounded = lenient(R"({"type":"number","minimum":3,"maximum":5})");
  EXPECT_TRUE(accepts(bounded, "10.5"));
  EXPECT_FALSE(accepts(bounded, "\"4\""));
  auto unique = lenient(R"({"type":"array","items":{"type":"integer"},"uniqueItems":true,"maxItems":2})");
  EXPECT_TRUE(accepts(unique, "[1,1]"));
  EXPECT_FALSE(accepts(unique, "[1,2,3]"));
  EXPECT_FALSE(accepts(unique, "[\"a\"]"));
  auto lookahead = lenient(R"j({"type":"string","pattern":"a(?=b)","maxLength":3})j");
  EXPECT_TRUE(accepts(lookahead, "\"zzz\""));
  EXPECT_FALSE(accepts(lookahead, "\"zzzz\""));
  auto pattern_and_min = lenient(R"({"type":"string","pattern":"^[a-z]+$","minLength":2000})");
  EXPECT_TRUE(accepts(pattern_and_min, "\"ab\""));  // the pattern holds, the minimum does not
  EXPECT_FALSE(accepts(pattern_and_min, "\"AB\""));
  auto ref = lenient(R"({"$defs":{"n":{"type":"integer"}},"$ref":"#/$defs/n","minimum":1,"type":"string"})");
  EXPECT_TRUE(accepts(ref, "5"));
  EXPECT_FALSE(accepts(ref, "\"5\""));
  auto all = lenient(R"({"allOf":[{"type":"integer"},{"minimum":2}]})");  // its first member
  EXPECT_TRUE(accepts(all, "1"));
  EXPECT_FALSE(accepts(all, "true"));
  auto beside = lenient(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],
                            "allOf":[{"required":["b"]}]})");  // the keywords beside allOf
  EXPECT_TRUE(accepts(beside, R"({"a":1})"));
  EXPECT_FALSE(accepts(beside, R"({"b":1})"));
}

// A malformed schema is refused whether strict or not, and not as something to ignore.
TEST(JsonSchema, MalformedSchemasAreRefusedEvenWhenNotStrict) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"({"type":"integer","minimum":"3"})", "minimum"},
      {R"({"type":"number","maximum":"3"})", "maximum"},
      {R"({"type":"integer","minimum":5,"maximum":4})", "minimum"},
      {R"({"type":"integer","exclusiveMinimum":4,"exclusiveMaximum":5})", "minimum"},
      {R"({"type":"integer","minimum":1e16})", "minimum"},
      {R"({"type":"array","uniqueItems":1})", "uniqueItems"},
      {R"({"type":"object","minProperties":-1})", "minProperties"},
      {R"({"not":3})", "not"},
      {R"({"$ref":"#/$defs/missing"})", "$ref"},
      {R"({"type":"strin"})", "type"},
      {R"({"type":"string","pattern":"(a"})", "pattern"},
      {R"({"type":"string","pattern":7})", "pattern"},
      {R"({"type":"object","properties":[]})", "properties"},
      {R"({"allOf":[]})", "allOf"},
      {R"("object")", "schema"},
      {R"({"type":"string","minLength":3,"maxLength":2})", "maxLength"},
  };
  for (const auto& [text, keyword] : cases)
    for (bool strict : {true, false})
      EXPECT_EQ(refusal(text, strict), std::make_pair(std::string(keyword), false)) << text << " strict " << strict;
}

// Tool parameters are strict only when the function says strict: true.
TEST(JsonSchema, ToolParametersAreStrictOnlyWhenTheFunctionSaysSo) {
  auto tools = [](const char* strict) {
    return json::parse(std::string(R"([{"type":"function","function":{"name":"f",)") + strict +
                       R"("parameters":{"type":"object","properties":{"n":{"type":"number","minimum":1}},"required":["n"]}}}])");
  };
  auto lenient = compile_tool_calls(tools(""), ToolCallStyle::hermes, "", 1);
  EXPECT_TRUE(accepts(lenient, "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"n\":0}}\n</tool_call>"));
  EXPECT_TRUE(compile_tool_calls(tools(R"("strict":false,)"), ToolCallStyle::qwen3_coder, "", 1));
  try {
    compile_tool_calls(tools(R"("strict":true,)"), ToolCallStyle::hermes, "", 1);
    ADD_FAILURE() << "strict tool parameters with 'minimum' compiled";
  } catch (const SchemaError& e) {
    EXPECT_EQ(e.keyword, "minimum");
    EXPECT_TRUE(e.unsupported);
  }
  EXPECT_THROW(compile_tool_calls(tools(R"("strict":"yes",)"), ToolCallStyle::hermes, "", 1), SchemaError);
}

TEST(JsonSchema, ToolCallsInBothFormats) {
  json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}},
      {"type":"function","function":{"name":"now"}}])");
  auto hermes = compile_tool_calls(tools, ToolCallStyle::hermes, "", 2);
  EXPECT_TRUE(accepts(hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
  EXPECT_TRUE(accepts(hermes, "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>\n"
                              "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>"));
  EXPECT_FALSE(accepts(hermes, "<tool_call>\n{\"arguments\":{},\"name\":\"now\"}\n</tool_call>"));  // name first
  EXPECT_FALSE(accepts(hermes, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{}}\n</tool_call>"));
  EXPECT_FALSE(accepts(hermes, ""));
  auto one = compile_tool_calls(tools, ToolCallStyle::hermes, "now", 1);
  EXPECT_FALSE(accepts(one, "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>\n"
                            "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>"));
  EXPECT_FALSE(accepts(one, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"x\"}}\n</tool_call>"));
  auto coder = compile_tool_calls(tools, ToolCallStyle::qwen3_coder, "", 1);
  EXPECT_TRUE(accepts(coder, "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n"
                             "<parameter=city>\nNew York\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_TRUE(accepts(coder, "<tool_call>\n<function=now>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(coder, "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(coder, "<tool_call>\n<function=get_weather>\n<parameter=city>\na<b\n</parameter>\n</function>\n</tool_call>"));
}

// A key that may no longer come is refused at its first byte that rules out every other key, so
// every state the matcher keeps can still be completed (found by fuzz_json_schema: "</" before a
// required parameter was taken, and the state had no way to end).
TEST(JsonSchema, KeysThatMayNotComeAreRefusedAtTheirFirstByte) {
  auto coder = compile_tool_calls(json::parse(R"([{"type":"function","function":{"name":"f","strict":true,"parameters":
      {"type":"object","properties":{"q":{"type":"string"},"k":{"type":"integer"}},"required":["q"]}}}])"),
                                  ToolCallStyle::qwen3_coder, "", 2);
  GrammarMatcher m(coder.get());
  const std::string head = "<tool_call>\n<function=f>\n<";
  ASSERT_TRUE(m.feed(head.data(), head.size()));
  GrammarMatcher end;
  end.copy_from(m);
  EXPECT_FALSE(end.feed('/'));  // "</function>" before the required q
  EXPECT_TRUE(m.feed('p'));
  auto object = schema(R"({"type":"object","properties":{"a":{"type":"integer"},"ab":{"type":"integer"}}})");
  GrammarMatcher dup(object.get());
  const std::string seen = "{\"a\":1,\"a";
  ASSERT_TRUE(dup.feed(seen.data(), seen.size()));
  EXPECT_LT(dup.min_bytes(), 100);  // "ab" is still open
  EXPECT_FALSE(dup.feed('"'));      // a second "a" is not
}

// Draws tokens at random among the allowed ones until the output may end (or the budget is
// spent), checking on the way that the fast path and the full trie walk agree.
std::string random_output(const std::shared_ptr<const Grammar>& g, uint64_t seed, int64_t budget, bool compare) {
  OutputConstraint spec;
  spec.grammar = g;
  const int32_t eos = vocab()->find("<|im_end|>");
  TokenConstraint fast(spec, vocab(), {eos}), slow(spec, vocab(), {eos});
  slow.use_fast_path = false;
  std::vector<float> logits(size_t(vocab()->vocab_size()));
  std::mt19937_64 rng(seed);
  std::string out;
  for (int64_t remaining = budget; remaining > 0; --remaining) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    EXPECT_TRUE(fast.mask(logits, remaining)) << out;
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < int32_t(logits.size()); ++id)
      if (std::isfinite(logits[size_t(id)])) allowed.push_back(id);
    if (compare && remaining % 4 == 0) {  // the full walk is slow: every fourth step
      std::vector<float> check(logits.size(), 0.0f);
      slow.mask(check, remaining);
      for (int32_t id = 0; id < int32_t(check.size()); ++id)
        if (std::isfinite(check[size_t(id)]) != std::isfinite(logits[size_t(id)])) {
          ADD_FAILURE() << "token " << id << " '" << vocab()->bytes(id) << "' after '" << out << "'";
          return out;
        }
    }
    if (allowed.empty()) return out;
    // Prefer ending a little, so outputs are not always budget-bound.
    int32_t token = allowed[rng() % allowed.size()];
    if (fast.complete() && rng() % 4 == 0) token = eos;
    if (token == eos) return out;
    fast.accept(token);
    slow.accept(token);
    out += vocab()->bytes(token);
  }
  return out;
}

TEST(TokenMask, RandomOutputsAreValidAndFitTheBudget) {
  struct Case { const char* schema; int64_t budget; };
  const Case cases[] = {
      {R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"n":{"type":"integer"},
          "tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":3}},"required":["name","n","tags"]})", 60},
      {R"({"type":"object","properties":{"s":{"type":"string","minLength":5}},"required":["s"]})", 30},
      {R"({"type":"object"})", 40},
      {R"({"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"}},"required":["n"],
          "additionalProperties":{"type":"boolean"}})", 40},
      {R"({"anyOf":[{"type":"integer"},{"type":"string","pattern":"[a-c]{2,4}"}]})", 12},
      {R"({"type":"object","properties":{"code":{"type":"string","pattern":"^[a-z]+(-[0-9]{2})*$","minLength":7,
          "maxLength":10}},"required":["code"]})", 24},
      {R"({"type":"array","items":{"type":"integer","minimum":-300,"maximum":4000},"minItems":2,"maxItems":4})", 24},
  };
  for (const Case& c : cases) {
    auto g = schema(c.schema);
    for (uint64_t seed = 0; seed < 4; ++seed) {
      std::string out = random_output(g, seed, c.budget, seed < 2);
      EXPECT_TRUE(accepts(g, out)) << c.schema << "\n" << out;
      EXPECT_NO_THROW((void)json::parse(out)) << out;
    }
  }
  auto coder = compile_tool_calls(json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{"q":{"type":"string"},"k":{"type":"integer"}},"required":["q","k"]}}}])"), ToolCallStyle::qwen3_coder, "", 2);
  for (uint64_t seed = 0; seed < 4; ++seed) {
    std::string out = random_output(coder, seed, 160, seed == 0);
    EXPECT_TRUE(accepts(coder, out)) << out;
  }
}

TEST(TokenMask, KeysListedOrAdditionalMaskAsTheFullWalk) {
  OutputConstraint spec;
  spec.grammar = schema(R"({"type":"object","properties":{"name":{"type":"string"},"nam":{"type":"integer"}},
                            "additionalProperties":{"type":"boolean"}})");
  for (const char* prefix : {"{\"", "{\"na", "{\"nam", "{\"x\":true,\"name"}) {
    TokenConstraint fast(spec, vocab(), {}), slow(spec, vocab(), {});
    slow.use_fast_path = false;
    for (const char* p = prefix; *p; ++p) fast.accept(vocab()->find(std::string(1, *p))), slow.accept(vocab()->find(std::string(1, *p)));
    std::vector<float> a(size_t(vocab()->vocab_size()), 0.0f), b = a;
    fast.mask(a, 30);
    slow.mask(b, 30);
    int allowed = 0;
    for (size_t id = 0; id < a.size(); ++id) {
      ASSERT_EQ(std::isfinite(a[id]), std::isfinite(b[id])) << prefix << " token '" << vocab()->bytes(int32_t(id)) << "'";
      allowed += std::isfinite(a[id]);
    }
    EXPECT_GT(allowed, 1000) << prefix;  // additional names are free text
  }
}

TEST(TokenMask, TightBudgetAllowsOnlyWhatStillCloses) {
  auto g = schema(R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"]})");
  OutputConstraint spec;
  spec.grammar = g;
  TokenConstraint c(spec, vocab(), {vocab()->find("<|im_end|>")});
  EXPECT_EQ(c.min_bytes(), 8);  // {"a":""}
  std::vector<float> logits(size_t(vocab()->vocab_size()), 0.0f);
  EXPECT_TRUE(c.mask(logits, 8));
  EXPECT_TRUE(c.allowed(vocab()->find("{\"")));
  EXPECT_FALSE(c.allowed(vocab()->find(" ")));
  for (const char* piece : {"{\"", "a", "\":", "\""}) c.accept(vocab()->find(piece));
  EXPECT_TRUE(c.mask(logits, 2));  // '"' and '}' still fit, nothing else
  EXPECT_TRUE(c.allowed(vocab()->find("\"")));
  EXPECT_TRUE(c.allowed(vocab()->find("\"}")));
  EXPECT_FALSE(c.allowed(vocab()->find("x")));
  EXPECT_TRUE(c.mask(logits, 3));
  EXPECT_TRUE(c.allowed(vocab()->find("x")));
  EXPECT_TRUE(c.mask(logits, 1));  // out of reach anyway: the grammar alone, best effort
  EXPECT_TRUE(c.allowed(vocab()->find("x")));
  // The grammar alone still refuses what can never end: a tool call's "arguments" before its name.
  spec.grammar = compile_tool_calls(json::parse(R"([{"type":"function","function":{"name":"f"}}])"), ToolCallStyle::hermes, "", 1);
  TokenConstraint call(spec, vocab(), {vocab()->find("<|im_end|>")});
  for (const char* piece : {"<tool_call>", "\n", "{\""}) call.accept(vocab()->find(piece));
  ASSERT_GE(vocab()->find("arguments"), 0);
  ASSERT_GE(vocab()->find("name"), 0);
  EXPECT_TRUE(call.mask(logits, 2));
  EXPECT_TRUE(call.allowed(vocab()->find("name")));
  EXPECT_FALSE(call.allowed(vocab()->find("arguments")));
}

TEST(TokenMask, ThinkingIsFreeUntilItsEnd) {
  OutputConstraint spec;
  spec.grammar = json_object_grammar();
  spec.in_thinking = true;
  const int32_t eos = vocab()->find("<|im_end|>"), close = vocab()->find("</think>");
  TokenConstraint c(spec, vocab(), {eos});
  std::vector<float> logits(size_t(vocab()->vocab_size()), 0.0f);
  c.mask(logits, 100);
  EXPECT_TRUE(c.allowed(vocab()->find("hello")));
  EXPECT_FALSE(std::isfinite(logits[size_t(eos)]));
  std::fill(logits.begin(), logits.end(), 0.0f);
  c.mask(logits, 3);  // </think> and "{}" only just fit
  EXPECT_TRUE(c.allowed(close));
  EXPECT_FALSE(c.allowed(vocab()->find("hello")));
  c.accept(close);
  c.mask(logits, 2);
  EXPECT_TRUE(c.allowed(vocab()->find("{")));
  EXPECT_FALSE(c.allowed(vocab()->find("hello")));
}

TEST(TokenMask, AThinkingModelMayOpenReasoningFirst) {
  OutputConstraint spec;
  spec.grammar = json_object_grammar();
  spec.may_think = true;
  const int32_t open = vocab()->find("<think>"), close = vocab()->find("</think>");
  std::vector<float> logits(size_t(vocab()->vocab_size()), 0.0f);
  TokenConstraint direct(spec, vocab(), {}), thinking(spec, vocab(), {});
  direct.mask(logits, 50);
  EXPECT_TRUE(direct.allowed(open));
  EXPECT_TRUE(direct.allowed(vocab()->find("{\"")));
  EXPECT_FALSE(direct.allowed(vocab()->find("hello")));
  direct.accept(vocab()->find("{"));  // no reasoning: constrained from here on
  direct.mask(logits, 49);
  EXPECT_FALSE(direct.allowed(open));
  thinking.accept(open);
  thinking.mask(logits, 49);
  EXPECT_TRUE(thinking.allowed(vocab()->find("hello")));
  thinking.accept(close);
  thinking.mask(logits, 48);
  EXPECT_FALSE(thinking.allowed(vocab()->find("hello")));
  EXPECT_TRUE(thinking.allowed(vocab()->find("{")));
}

}  // namespace
}  // namespace ellm
