// Request parsing and validation: every rule answers with the right status and names the field.
#include <gtest/gtest.h>

#include "server/api_request.h"

namespace ellm {
namespace {

using json = nlohmann::ordered_json;

SamplingParams defaults() {
  SamplingParams s;
  s.temperature = 0.6f;
  s.top_k = 20;
  s.top_p = 0.95f;
  return s;
}

json chat_body() { return {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}; }

// Expects parse_chat_request to fail with `status` and the given param.
void expect_chat_error(const json& body, int status, const std::string& param) {
  try {
    parse_chat_request(body, defaults());
    FAIL() << "accepted " << body.dump();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, status) << body.dump();
    EXPECT_EQ(e.param, param) << e.what();
    EXPECT_FALSE(std::string(e.what()).empty());
  }
}

TEST(ParseBody, RejectsMalformedJsonWithTheReason) {
  try {
    parse_body("{\"messages\": [");
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos);
  }
  // A number beyond double is an out_of_range error in nlohmann, still a 400.
  EXPECT_THROW(parse_body("{\"max_tokens\": 1e999999}"), ApiError);
  EXPECT_THROW(parse_body("[1, 2]"), ApiError);  // not an object
  EXPECT_THROW(parse_body(""), ApiError);
}

TEST(ParseBody, RejectsInvalidUtf8AndRawControlBytes) {
  EXPECT_THROW(parse_body("{\"prompt\": \"\xff\xfe\"}"), ApiError);
  EXPECT_THROW(parse_body(std::string("{\"prompt\": \"a\0b\"}", 16)), ApiError);
  // A NUL after a complete object must not end the input early (nlohmann would stop there).
  EXPECT_THROW(parse_body(std::string("{\"prompt\": \"ab\"}\0junk", 21)), ApiError);
  EXPECT_THROW(parse_body(std::string("{\"prompt\": \"ab\"}\0", 17)), ApiError);
  // An escaped NUL is valid JSON and a valid string.
  EXPECT_EQ(parse_body("{\"prompt\": \"a\\u0000b\"}")["prompt"].get<std::string>().size(), 3u);
}

TEST(ParseBody, RejectsDeepNestingButNotBracketsInStrings) {
  std::string deep = "{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}";
  EXPECT_THROW(parse_body(deep), ApiError);
  std::string in_string = "{\"a\": \"" + std::string(1000, '[') + "\"}";
  EXPECT_EQ(parse_body(in_string)["a"].get<std::string>().size(), 1000u);
  std::string escaped_quote = "{\"a\": \"\\\"[[[[\"}";
  EXPECT_NO_THROW(parse_body(escaped_quote, 2));
}

TEST(ChatRequest, DefaultsComeFromGenerationConfigAndFieldsOverride) {
  ChatRequest r = parse_chat_request(chat_body(), defaults());
  EXPECT_FLOAT_EQ(r.generate.sampling.temperature, 0.6f);
  EXPECT_EQ(r.generate.sampling.top_k, 20);
  EXPECT_EQ(r.generate.max_tokens, -1);
  EXPECT_FALSE(r.stream);

  json body = chat_body();
  body.update({{"temperature", 0}, {"top_k", -1}, {"top_p", 0.5}, {"min_p", 0.1}, {"seed", 7},
               {"max_tokens", 12}, {"stop", "END"}, {"stop_token_ids", {5, 6}}, {"ignore_eos", true},
               {"presence_penalty", 0.5}, {"frequency_penalty", -0.5}, {"repetition_penalty", 1.1},
               {"stream", true}, {"stream_options", {{"include_usage", true}}}, {"logprobs", true},
               {"top_logprobs", 3}, {"unknown_field", {1, 2, 3}}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
  r = parse_chat_request(body, defaults());
  EXPECT_FLOAT_EQ(r.generate.sampling.temperature, 0.0f);
  EXPECT_EQ(r.generate.sampling.top_k, -1);
  EXPECT_FLOAT_EQ(r.generate.sampling.top_p, 0.5f);
  EXPECT_FLOAT_EQ(r.generate.sampling.min_p, 0.1f);
  EXPECT_EQ(r.generate.sampling.seed, 7u);
  EXPECT_EQ(r.generate.max_tokens, 12);
  EXPECT_EQ(r.generate.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.generate.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(r.generate.ignore_eos);
  EXPECT_FLOAT_EQ(r.generate.sampling.repetition_penalty, 1.1f);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.generate.sampling.top_logprobs, 3);
  EXPECT_EQ(r.template_kwargs["enable_thinking"], false);
}

TEST(ChatRequest, MaxCompletionTokensIsAnAliasAndNullMeansAbsent) {
  json body = chat_body();
  body["max_completion_tokens"] = 9;
  body["temperature"] = nullptr;
  ChatRequest r = parse_chat_request(body, defaults());
  EXPECT_EQ(r.generate.max_tokens, 9);
  EXPECT_FLOAT_EQ(r.generate.sampling.temperature, 0.6f);
}

TEST(ChatRequest, MessagesAreRequiredAndChecked) {
  expect_chat_error({{"model", "m"}}, 400, "messages");
  expect_chat_error({{"messages", json::array()}}, 400, "messages");
  expect_chat_error({{"messages", "hello"}}, 400, "messages");
  expect_chat_error({{"messages", {{{"content", "no role"}}}}}, 400, "messages");
  expect_chat_error({{"messages", {{{"role", "user"}, {"content", 5}}}}}, 400, "messages");
}

TEST(ChatRequest, WrongTypesAndAbsurdValuesAre400) {
  auto with = [](const char* key, json value) {
    json b = chat_body();
    b[key] = std::move(value);
    return b;
  };
  expect_chat_error(with("temperature", "hot"), 400, "temperature");
  expect_chat_error(with("temperature", -0.5), 400, "temperature");
  expect_chat_error(with("temperature", std::numeric_limits<double>::infinity()), 400, "temperature");
  expect_chat_error(with("top_p", 0), 400, "top_p");
  expect_chat_error(with("top_p", 1.5), 400, "top_p");
  expect_chat_error(with("top_k", -5), 400, "top_k");
  expect_chat_error(with("top_k", 2.5), 400, "top_k");
  expect_chat_error(with("min_p", 2), 400, "min_p");
  expect_chat_error(with("max_tokens", 0), 400, "max_tokens");
  expect_chat_error(with("max_tokens", -3), 400, "max_tokens");
  expect_chat_error(with("max_tokens", "10"), 400, "max_tokens");
  expect_chat_error(with("stop", 5), 400, "stop");
  expect_chat_error(with("stop", json::array({"a", 1})), 400, "stop");
  expect_chat_error(with("stream", "yes"), 400, "stream");
  expect_chat_error(with("n", 17), 400, "n");
  expect_chat_error(with("n", 0), 400, "n");
  expect_chat_error(with("presence_penalty", 3), 400, "presence_penalty");
  expect_chat_error(with("repetition_penalty", 0), 400, "repetition_penalty");
  expect_chat_error(with("top_logprobs", 3), 400, "top_logprobs");  // without logprobs: true
  expect_chat_error(with("tools", "x"), 400, "tools");
  expect_chat_error(with("tools", json::array({{{"type", "function"}}})), 400, "tools");
  expect_chat_error(with("tool_choice", "sometimes"), 400, "tool_choice");
  expect_chat_error(with("chat_template_kwargs", 1), 400, "chat_template_kwargs");
  expect_chat_error(with("stop_token_ids", json::array({-1})), 400, "stop_token_ids");
  // n = 1 is fine.
  EXPECT_NO_THROW(parse_chat_request(with("n", 1), defaults()));
  EXPECT_EQ(parse_chat_request(with("n", 16), defaults()).n, 16);
}

TEST(ChatRequest, ToolChoiceForms) {
  json body = chat_body();
  body["tools"] = {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", json::object()}}}}};
  EXPECT_EQ(parse_chat_request(body, defaults()).tool_choice, "auto");
  body["tool_choice"] = "none";
  EXPECT_EQ(parse_chat_request(body, defaults()).tool_choice, "none");
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  ChatRequest r = parse_chat_request(body, defaults());
  EXPECT_EQ(r.tool_choice, "function");
  EXPECT_EQ(r.forced_function, "get_weather");
  EXPECT_EQ(r.tools.size(), 1u);
  // A function may be called "none": forcing it is not tool_choice "none".
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "none"}}}};
  r = parse_chat_request(body, defaults());
  EXPECT_EQ(r.tool_choice, "function");
  EXPECT_EQ(r.forced_function, "none");
}

TEST(CompletionRequest, PromptForms) {
  SamplingParams d = defaults();
  TextRequest r = parse_completion_request({{"prompt", "Hello"}}, d);
  EXPECT_FALSE(r.prompt_is_ids);
  EXPECT_EQ(r.prompt_text, "Hello");
  r = parse_completion_request({{"prompt", {1, 2, 3}}}, d);
  EXPECT_TRUE(r.prompt_is_ids);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  r = parse_completion_request({{"prompt", json::array({"only one"})}}, d);
  EXPECT_EQ(r.prompt_text, "only one");
  r = parse_completion_request({{"prompt", json::array({json::array({4, 5})})}}, d);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{4, 5}));
  r = parse_completion_request({{"prompt", "x"}, {"logprobs", 2}}, d);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.generate.sampling.top_logprobs, 2);

  for (json bad : {json{{"prompt", 5}}, json{{"prompt", ""}}, json{{"prompt", json::array()}},
                   json{{"prompt", {"a", "b"}}}, json{{"prompt", {1, -2}}}, json::object(),
                   json{{"prompt", "x"}, {"logprobs", 21}}}) {
    try {
      parse_completion_request(bad, d);
      FAIL() << "accepted " << bad.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << bad.dump();
    }
  }
}

}  // namespace
}  // namespace ellm

namespace ellm {
namespace {

TEST(ResponseFormat, CompiledOnceForChatAndCompletions) {
  json body = chat_body();
  EXPECT_EQ(parse_chat_request(body, defaults()).json_grammar, nullptr);
  body["response_format"] = {{"type", "text"}};
  EXPECT_EQ(parse_chat_request(body, defaults()).json_grammar, nullptr);
  body["response_format"] = {{"type", "json_object"}};
  EXPECT_NE(parse_chat_request(body, defaults()).json_grammar, nullptr);
  json text = {{"prompt", "x"}, {"response_format", {{"type", "json_schema"}, {"json_schema",
      {{"name", "n"}, {"strict", false}, {"schema", {{"type", "object"}, {"properties", {{"a", {{"type", "string"}}}}}}}}}}}};
  EXPECT_NE(parse_completion_request(text, defaults()).json_grammar, nullptr);
}

TEST(ResponseFormat, BadFormatsAndSchemasAre400sNamingTheKeyword) {
  auto with = [](json format) {
    json body = chat_body();
    body["response_format"] = std::move(format);
    return body;
  };
  expect_chat_error(with("json"), 400, "response_format");
  expect_chat_error(with({{"type", "yaml"}}), 400, "response_format");
  expect_chat_error(with({{"type", "json_schema"}}), 400, "response_format");
  expect_chat_error(with({{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}), 400, "response_format");
  expect_chat_error(with({{"type", "json_schema"}, {"json_schema", {{"schema", json::object()}, {"strict", "yes"}}}}),
                    400, "response_format");
  // strict: true refuses what it cannot enforce, naming it; without strict (OpenAI's default
  // false) it is ignored.
  const json multiple_of = {{"type", "number"}, {"multipleOf", 2}};
  try {
    parse_chat_request(with({{"type", "json_schema"}, {"json_schema", {{"schema", multiple_of}, {"strict", true}}}}), defaults());
    FAIL() << "multipleOf accepted with strict";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("keyword 'multipleOf'; with 'strict': false it is ignored"), std::string::npos) << e.what();
  }
  for (json spec : {json{{"schema", multiple_of}}, json{{"schema", multiple_of}, {"strict", false}}})
    EXPECT_NE(parse_chat_request(with({{"type", "json_schema"}, {"json_schema", spec}}), defaults()).json_grammar, nullptr);
  // A malformed schema is refused either way.
  expect_chat_error(with({{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "number"}, {"multipleOf", "2"}}}}}}),
                    400, "response_format");
}

}  // namespace
}  // namespace ellm
