// The Responses API over the chat request and event stream: items become the chat messages a
// chat completion would send, and engine events become output items whose deltas add up to them.
#include <gtest/gtest.h>

#include "server/responses_output.h"
#include "server/responses_request.h"

namespace ellm {
namespace {

using json = nlohmann::ordered_json;

ResponsesRequest parse(const char* body) { return parse_responses_request(json::parse(body), SamplingParams{}, ""); }

ApiError refusal(const char* body) {
  try {
    parse(body);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "", "");
}

TEST(ResponsesRequest, ItemsBecomeTheChatMessagesOfOneConversation) {
  ResponsesRequest r = parse(R"({"instructions": "Be brief.", "input": [
      {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
      {"role": "user", "content": "Weather?"},
      {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Call it."}]},
      {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
      {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
      {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
      {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "Done"}]},
      {"type": "message", "role": "system", "content": "Later rule."}],
    "reasoning": {"effort": "minimal"}, "max_output_tokens": 7})");
  const json& m = r.chat.messages;
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0], json::parse(R"({"role": "system", "content": "Be brief.\n\nRules."})"));
  EXPECT_EQ(m[1]["role"], "user");
  EXPECT_EQ(m[2]["reasoning_content"], "Call it.");
  ASSERT_EQ(m[2]["tool_calls"].size(), 2u);
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\"}");
  EXPECT_EQ(m[2]["tool_calls"][1]["function"]["arguments"], R"({"input":"*** Begin Patch"})");
  EXPECT_EQ(m[3], json::parse(R"({"role": "tool", "tool_call_id": "c1", "content": "sunny"})"));
  EXPECT_EQ(m[4]["content"], "Done");
  EXPECT_EQ(m[5]["role"], "user");  // a late system message stays in place
  EXPECT_EQ(r.chat.template_kwargs["enable_thinking"], false);
  EXPECT_EQ(r.chat.generate.max_tokens, 7);
  EXPECT_FALSE(r.chat.logprobs);
  ResponsesRequest with = parse(R"({"input": "hi", "top_logprobs": 3})");
  EXPECT_TRUE(with.chat.logprobs);
  EXPECT_EQ(with.chat.generate.sampling.top_logprobs, 3);
  EXPECT_TRUE(parse(R"({"input": "hi", "include": ["message.output_text.logprobs"]})").chat.logprobs);
}

TEST(ResponsesRequest, ToolKinds) {
  ResponsesRequest r = parse(R"({"input": "hi", "tool_choice": {"type": "custom", "name": "apply_patch"}, "tools": [
      {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}},
      {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
      {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "spawn"}]},
      {"type": "namespace", "name": "empty"},
      {"type": "web_search"}, {"type": "image_generation"}, {"type": "local_shell"}]})");
  ASSERT_EQ(r.chat.tools.size(), 3u);
  EXPECT_EQ(r.chat.tools[1]["function"]["parameters"]["required"], json::array({kCustomToolArgument}));
  EXPECT_NE(r.chat.tools[1]["function"]["parameters"]["properties"]["input"]["description"].get<std::string>().find("start: /.+/"),
            std::string::npos);
  EXPECT_EQ(r.custom_tools, std::set<std::string>{"apply_patch"});
  EXPECT_EQ(r.tool_namespaces.at("spawn"), "agents");
  EXPECT_EQ(r.chat.tool_choice, "function");
  EXPECT_EQ(r.chat.forced_function, "apply_patch");
}

TEST(ResponsesRequest, InputImagesBecomeImageUrlPartsAlsoInFunctionCallOutputs) {
  const ResponsesRequest r = parse(R"({"input": [
      {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,QUJD"}, {"type": "input_text", "text": "Hi"}]},
      {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "taken"},
                                                                  {"type": "input_image", "image_url": "data:image/png;base64,REVG"}]},
      {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "plain"}]}]})");
  const json& m = r.chat.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0]["content"][0], json::parse(R"({"type":"image_url","image_url":{"url":"data:image/png;base64,QUJD"}})"));
  EXPECT_EQ(m[2]["content"], json::parse(R"([{"type":"text","text":"taken"},
      {"type":"image_url","image_url":{"url":"data:image/png;base64,REVG"}}])"));
  EXPECT_EQ(m[3]["content"], "plain");  // without an image, a tool's output stays text
  EXPECT_NE(std::string(refusal(R"({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]})").what()).find("file_id"),
            std::string::npos);
}

TEST(ResponsesRequest, BadInputNamesTheField) {
  EXPECT_EQ(refusal(R"({"input": "hi", "tools": [{"type": "hologram"}]})").param, "tools");
  EXPECT_EQ(refusal(R"({"input": [{"type": "function_call_output", "call_id": "x", "output": "1"}]})").param, "input");
  EXPECT_NE(std::string(refusal(R"({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})").what()).find("input_image"),
            std::string::npos);
  EXPECT_EQ(refusal(R"({"input": "hi", "previous_response_id": "resp_1"})").param, "previous_response_id");
  EXPECT_EQ(refusal(R"({"input": "hi", "max_output_tokens": 0})").param, "max_output_tokens");
  EXPECT_EQ(refusal(R"({"input": "hi", "text": {"format": {"type": "json_schema", "schema": 5}}})").param, "text.format");
  EXPECT_EQ(refusal(R"({"input": [{"type": "message", "role": "user"}]})").param, "input");
  // Fields of the wrong type are refusals too, never a server error.
  EXPECT_EQ(refusal(R"({"input": "hi", "text": {"format": {"type": 5}}})").param, "text.format");
  EXPECT_EQ(refusal(R"({"input": "hi", "tool_choice": {"type": 5, "name": "f"}})").param, "tool_choice");
  EXPECT_EQ(refusal(R"({"input": "hi", "tools": [{"type": "custom", "name": "c", "format": {"syntax": 1}}], "stream": 3})").param, "stream");
  EXPECT_EQ(refusal(R"({"input": [{"type": "function_call", "call_id": 1, "name": "f", "arguments": "{}"}]})").param, "input");
  EXPECT_EQ(refusal(R"({"input": [{"role": "user", "content": [{"type": "input_text", "text": null}]}]})").param, "input");
  EXPECT_EQ(refusal(R"({"input": "hi", "reasoning": {"effort": 3}})").param, "reasoning.effort");
  EXPECT_EQ(refusal(R"({"input": "hi", "instructions": ["x"]})").param, "instructions");
  EXPECT_EQ(refusal(R"({"input": {"role": "user"}})").param, "input");
}

StreamEvent piece(std::string text, int ids = 1) {
  StreamEvent e;
  e.text = std::move(text);
  e.ids.assign(ids, 1);
  return e;
}

StreamEvent end(int64_t completion) {
  StreamEvent e;
  e.finished = true;
  e.prompt_tokens = 100;
  e.cached_tokens = 90;
  e.completion_tokens = completion;
  return e;
}

ResponsesOutput responses_output(bool stream_calls, bool logprobs = false) {
  ResponsesMeta meta{"resp_1", "tiny", 1, nlohmann::json::object(), {"apply_patch"}, {}, logprobs,
                     [](int32_t id) { return "t" + std::to_string(id); }};
  nlohmann::json tools = nlohmann::json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
      {"type": "function", "function": {"name": "apply_patch", "parameters": {"type": "object", "properties": {"input": {"type": "string"}}}}}])");
  auto parser = std::make_unique<OutputParser>(ToolCallFormat::qwen3_coder_xml, true, true, tools);
  if (stream_calls) parser->stream_tool_calls();
  return ResponsesOutput(std::move(meta), std::move(parser));
}

TEST(ResponsesOutput, DeltasAddUpToTheItemsHoweverTheTextIsSplit) {
  const std::string text =
      "Think.\n</think>\n\nSure.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "</function>\n</tool_call>\n<tool_call>\n<function=apply_patch>\n<parameter=input>\n*** Begin Patch\n"
      "</parameter>\n</function>\n</tool_call>";
  nlohmann::json whole;
  for (size_t step : {text.size(), size_t(1), size_t(7)}) {
    ResponsesOutput out = responses_output(step != text.size());
    std::vector<nlohmann::json> events = out.on_start();
    for (size_t at = 0; at < text.size(); at += step)
      for (auto& e : out.on_event(piece(text.substr(at, step)))) events.push_back(std::move(e));
    for (auto& e : out.on_event(end(40))) events.push_back(std::move(e));

    std::map<int64_t, std::string> built;
    for (size_t i = 0; i < events.size(); ++i) {
      const nlohmann::json& e = events[i];
      EXPECT_EQ(e["sequence_number"], i);
      const std::string type = e["type"];
      if (type.ends_with(".delta")) built[e["output_index"]] += e["delta"].get<std::string>();
    }
    EXPECT_EQ(events.back()["type"], "response.completed");
    nlohmann::json r = out.response();
    ASSERT_EQ(r["output"].size(), 4u);
    EXPECT_EQ(r["output"][0]["content"][0]["text"], "Think.");
    EXPECT_EQ(r["output"][1]["content"][0]["text"], "Sure.");
    EXPECT_EQ(r["output"][2]["type"], "function_call");
    EXPECT_EQ(nlohmann::json::parse(r["output"][2]["arguments"].get<std::string>()), nlohmann::json({{"city", "Paris"}}));
    EXPECT_EQ(r["output"][3]["type"], "custom_tool_call");
    EXPECT_EQ(r["output"][3]["input"], "*** Begin Patch");
    EXPECT_EQ(built[0], "Think.");
    EXPECT_EQ(built[1], "Sure.");
    EXPECT_EQ(built[2], r["output"][2]["arguments"]);
    EXPECT_EQ(built[3], "*** Begin Patch");
    EXPECT_EQ(r["usage"]["input_tokens_details"]["cached_tokens"], 90);
    if (step == 1) {  // one token a character: the reasoning's count is its characters and the </think>
      EXPECT_GE(r["usage"]["output_tokens_details"]["reasoning_tokens"], 6);
      EXPECT_LT(r["usage"]["output_tokens_details"]["reasoning_tokens"], 20);
    }
    r.erase("id");
    r.erase("usage");
    for (auto& item : r["output"]) item.erase("id"), item.erase("call_id");
    if (whole.is_null()) whole = r;
    EXPECT_EQ(r, whole) << "split every " << step;
  }
}

TEST(ResponsesOutput, MessageTextCarriesItsTokensLogprobs) {
  ResponsesOutput out = responses_output(true, /*logprobs=*/true);
  auto with_logprobs = [](std::string text, std::vector<int32_t> ids) {
    StreamEvent e = piece(std::move(text), 0);
    e.ids = ids;
    for (int32_t id : ids) e.logprobs.push_back({id, -0.5f, {{id, -0.5f}, {id + 1, -1.5f}}});
    return e;
  };
  out.on_event(with_logprobs("Hmm.\n</think>\n\n", {1, 2}));  // the reasoning's tokens are not the text's
  std::vector<nlohmann::json> events = out.on_event(with_logprobs("Hi", {3}));
  for (auto& e : out.on_event(with_logprobs(" there", {4, 5}))) events.push_back(std::move(e));
  out.on_event(end(5));
  size_t streamed = 0;
  for (const auto& e : events)
    if (e["type"] == "response.output_text.delta") streamed += e["logprobs"].size();
  const nlohmann::json part = out.response()["output"][1]["content"][0];
  EXPECT_EQ(part["text"], "Hi there");
  ASSERT_EQ(part["logprobs"].size(), 3u);
  EXPECT_EQ(streamed, 3u);
  EXPECT_EQ(part["logprobs"][0]["token"], "t3");
  EXPECT_EQ(part["logprobs"][0]["top_logprobs"].size(), 2u);
}

TEST(ResponsesOutput, LengthIsIncompleteAndFailureIsFailed) {
  ResponsesOutput cut = responses_output(true);
  cut.on_event(piece("Thinking on"));
  StreamEvent last = end(5);
  last.finish_reason = FinishReason::length;
  EXPECT_EQ(cut.on_event(last).back()["type"], "response.incomplete");
  EXPECT_EQ(cut.response()["incomplete_details"]["reason"], "max_output_tokens");

  ResponsesOutput broken = responses_output(true);
  auto events = broken.failed("context_length_exceeded", "too long");
  EXPECT_EQ(events.back()["type"], "response.failed");
  EXPECT_EQ(events.back()["response"]["error"]["code"], "context_length_exceeded");
}

}  // namespace
}  // namespace ellm
