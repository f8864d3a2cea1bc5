// The Anthropic Messages API: request bodies -> the internal chat request (system folding, the
// billing header, tool blocks, bad input), and engine events -> content blocks, where the
// streamed events add up to the whole message.
#include <gtest/gtest.h>

#include "server/anthropic_request.h"
#include "server/anthropic_response.h"

namespace ellm {
namespace {

using json = nlohmann::ordered_json;

json body_with(json messages) {
  return {{"model", "m"}, {"max_tokens", 64}, {"messages", std::move(messages)}};
}

// A list of messages in braces: a braced list of one json object initialises a json parameter
// as a copy of that object with clang, as a one-element array with g++.
json body_with(std::initializer_list<json> messages) {
  json list = json::array();
  for (const json& m : messages) list.push_back(m);
  return body_with(std::move(list));
}

json user(json content) { return {{"role", "user"}, {"content", std::move(content)}}; }

int status_of(const json& body) {
  try {
    parse_messages_request(body, {});
  } catch (const ApiError& e) {
    return e.status;
  }
  return 200;
}

std::string error_of(const json& body) {
  try {
    parse_messages_request(body, {});
  } catch (const ApiError& e) {
    return e.what();
  }
  return "";
}

TEST(MessagesRequest, SystemBlocksDropTheBillingHeaderAndAMidConversationSystemFoldsInPlace) {
  json body = body_with(json::array({user("Hi"),
                                     {{"role", "system"}, {"content", "Agents: A, B"}},
                                     {{"role", "assistant"}, {"content", "Hello"}},
                                     {{"role", "system"}, {"content", "Later note"}},
                                     user("Go")}));
  body["system"] = json::array({{{"type", "text"}, {"text", "x-anthropic-billing-header: cc_version=1; nonce=7;"}},
                                {{"type", "text"}, {"text", "You are an agent."}, {"cache_control", {{"type", "ephemeral"}}}},
                                {{"type", "text"}, {"text", "Be brief."}}});
  const json m = parse_messages_request(body, {}).chat.messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], json({{"role", "system"}, {"content", "You are an agent.\n\nBe brief."}}));
  EXPECT_EQ(m[1]["role"], "user");
  EXPECT_EQ(m[1]["content"], json::parse(R"([{"type":"text","text":"Hi"},{"type":"text","text":"\n\nAgents: A, B"}])"));
  EXPECT_EQ(m[2]["content"], "Hello");
  EXPECT_EQ(m[3], json({{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Later note"}}})}}));
  EXPECT_EQ(m[4]["role"], "user");
}

TEST(MessagesRequest, ToolBlocksBecomeToolCallsAndToolMessages) {
  json body = body_with(json::array(
      {user("Weather?"),
       {{"role", "assistant"},
        {"content", json::parse(R"([{"type":"thinking","thinking":"Look it up.","signature":"x"},
            {"type":"redacted_thinking","data":"opaque"},
            {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}])")}},
       user(json::parse(R"([{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"}]},
            {"type":"tool_result","tool_use_id":"toolu_1","content":"no such city","is_error":true},
            {"type":"text","text":"Thanks"}])"))}));
  body["tools"] = json::parse(R"([{"name":"get_weather","description":"d","input_schema":{"type":"object"}},
      {"type":"web_search_20250305","name":"web_search","max_uses":5}])");
  body["tool_choice"] = {{"type", "any"}, {"disable_parallel_tool_use", true}};
  body["thinking"] = {{"type", "disabled"}};
  body["stop_sequences"] = {"END"};
  const ChatRequest chat = parse_messages_request(body, {}).chat;
  const json& m = chat.messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[1]["reasoning_content"], "Look it up.");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"], json({{"city", "Paris"}}));
  EXPECT_EQ(m[2], json({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "sunny"}}));
  EXPECT_EQ(m[3]["content"], "Error: no such city");
  EXPECT_EQ(m[4]["role"], "user");
  ASSERT_EQ(chat.tools.size(), 1u);  // the server tool is left out
  EXPECT_EQ(chat.tools[0]["function"]["parameters"], json({{"type", "object"}}));
  EXPECT_EQ(chat.tool_choice, "required");
  EXPECT_FALSE(chat.parallel_tool_calls);
  EXPECT_EQ(chat.template_kwargs["enable_thinking"], false);
  EXPECT_EQ(chat.generate.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(chat.generate.max_tokens, 64);
}

TEST(MessagesRequest, ASystemEntryBetweenACallAndItsResultIsAUserTurnOfItsOwn) {
  const json m = parse_messages_request(
      body_with(json::array({user("Go"),
                             {{"role", "assistant"}, {"content", json::parse(R"([{"type":"tool_use","id":"t1","name":"f","input":{}}])")}},
                             {{"role", "system"}, {"content", "A reminder"}},
                             user(json::parse(R"([{"type":"tool_result","tool_use_id":"t1","content":"done"}])"))})),
      {}).chat.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[2]["content"][0]["text"], "A reminder");
  EXPECT_EQ(m[3], json({{"role", "tool"}, {"tool_call_id", "t1"}, {"content", "done"}}));
}

TEST(MessagesRequest, DeferredToolsJoinOnceToolSearchLoadsThem) {
  json body = body_with(json::array({user("Fetch it")}));
  body["tools"] = json::parse(R"([{"name":"ToolSearch","input_schema":{"type":"object"}},
      {"name":"WebFetch","input_schema":{"type":"object"},"defer_loading":true}])");
  EXPECT_EQ(parse_messages_request(body, {}).chat.tools.size(), 1u);
  body["messages"] = json::array(
      {user("Fetch it"),
       {{"role", "assistant"}, {"content", json::parse(R"([{"type":"tool_use","id":"t1","name":"ToolSearch","input":{}}])")}},
       user(json::parse(R"([{"type":"tool_result","tool_use_id":"t1","content":[{"type":"tool_reference","tool_name":"WebFetch"}]}])"))});
  const ChatRequest chat = parse_messages_request(body, {}).chat;
  ASSERT_EQ(chat.tools.size(), 2u);
  EXPECT_EQ(chat.tools[1]["function"]["name"], "WebFetch");
  EXPECT_EQ(chat.messages[2]["content"], "Tool loaded: WebFetch");
}

// Images (a user's, and a screenshot a tool returns) become chat image_url parts with data URIs,
// in place; the server reads them when the model has a vision tower.
TEST(MessagesRequest, ImageBlocksBecomeImageUrlPartsAlsoInToolResults) {
  json body = body_with(json::array(
      {user(json::parse(R"([{"type":"image","source":{"type":"base64","media_type":"image/png","data":"QUJD"}},
            {"type":"text","text":"What is it?"}])")),
       {{"role", "assistant"}, {"content", json::parse(R"([{"type":"tool_use","id":"t1","name":"shot","input":{}}])")}},
       user(json::parse(R"([{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"taken"},
            {"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"REVG"}}]}])"))}));
  body["tools"] = json::parse(R"([{"name":"shot","input_schema":{"type":"object"}}])");
  const json& m = parse_messages_request(body, {}).chat.messages;
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0]["content"][0], json::parse(R"({"type":"image_url","image_url":{"url":"data:image/png;base64,QUJD"}})"));
  EXPECT_EQ(m[0]["content"][1]["text"], "What is it?");
  EXPECT_EQ(m[2]["role"], "tool");
  EXPECT_EQ(m[2]["content"], json::parse(R"([{"type":"text","text":"taken"},
      {"type":"image_url","image_url":{"url":"data:image/jpeg;base64,REVG"}}])"));
  EXPECT_NE(error_of(body_with({user(json::parse(R"([{"type":"image","source":{"type":"url","url":"https://x/y.png"}}])"))}))
                .find("messages[0].content[0]: image sources of type 'url' are not supported"),
            std::string::npos);
}

TEST(MessagesRequest, BadInputIsA400NamingThePart) {
  EXPECT_NE(error_of(body_with({user(json::parse(R"([{"type":"image","source":{"type":"base64"}}])"))}))
                .find("messages[0].content[0]: a base64 image source needs"),
            std::string::npos);
  EXPECT_EQ(status_of(body_with({user(json::parse(R"([{"text":"no type"}])"))})), 400);
  EXPECT_EQ(status_of(body_with({user(json::parse(R"([{"type":"text","text":7}])"))})), 400);
  EXPECT_NE(error_of(body_with({user(json::parse(R"([{"type":"tool_result","tool_use_id":"nope","content":"x"}])"))}))
                .find("answers no tool_use"),
            std::string::npos);
  json tools = body_with({user("x")});
  tools["tools"] = json::parse(R"([{"type":"frobnicate_2030","name":"f"}])");
  EXPECT_NE(error_of(tools).find("unknown tool type 'frobnicate_2030'"), std::string::npos);
  json no_max = body_with({user("x")});
  no_max.erase("max_tokens");
  EXPECT_EQ(status_of(no_max), 400);
  EXPECT_NO_THROW(parse_messages_request(no_max, {}, /*count_only=*/true));
  EXPECT_EQ(status_of(body_with({user("x"), {{"role", "assistant"}, {"content", "prefill"}}})), 400);
}

TEST(MessagesRequest, OmittedThinkingComesBackFromItsSignature) {
  const std::string reasoning = "Step 1: \xc3\xa9t\xc3\xa9 <tag> & more";
  const std::string signature = thinking_signature(reasoning);
  EXPECT_EQ(reasoning_from_signature(signature), reasoning);
  EXPECT_EQ(reasoning_from_signature("EqQBCkgIARABGAIiQL"), std::nullopt);
  json assistant = {{"role", "assistant"},
                    {"content", json::array({{{"type", "thinking"}, {"thinking", ""}, {"signature", signature}},
                                             {{"type", "text"}, {"text", "Done"}}})}};
  const json m = parse_messages_request(body_with({user("a"), assistant, user("b")}), {}).chat.messages;
  EXPECT_EQ(m[1]["reasoning_content"], reasoning);
}

StreamEvent text_event(std::string text) {
  StreamEvent e;
  e.text = std::move(text);
  e.ids = {1};
  return e;
}

StreamEvent end_event(FinishReason reason, std::string stop_sequence = "") {
  StreamEvent e;
  e.finished = true;
  e.finish_reason = reason;
  e.stop_sequence = std::move(stop_sequence);
  e.prompt_tokens = 100;
  e.completion_tokens = 9;
  e.cached_tokens = 96;
  return e;
}

MessagesOutput messages_output(bool show_thinking = true) {
  nlohmann::json tools = nlohmann::json::parse(R"([{"type":"function","function":{"name":"get_weather",
      "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
  auto parser = std::make_unique<OutputParser>(ToolCallFormat::qwen3_coder_xml, true, true, tools);
  parser->stream_tool_calls();
  ResponseMeta meta{"msg_1", "tiny", 0, false, false, true};
  meta.prompt_tokens = 100;
  return MessagesOutput(meta, std::move(parser), show_thinking);
}

// Rebuilds the message from the events as a client does, checking their order.
nlohmann::json replay(const std::vector<nlohmann::json>& events) {
  nlohmann::json message;
  std::vector<std::string> partial;
  for (const auto& e : events) {
    const std::string type = e["type"];
    if (type == "message_start") {
      message = e["message"];
    } else if (type == "content_block_start") {
      EXPECT_EQ(e["index"], message["content"].size());
      message["content"].push_back(e["content_block"]);
      partial.emplace_back();
    } else if (type == "content_block_delta") {
      nlohmann::json& block = message["content"][e["index"].get<size_t>()];
      const nlohmann::json& d = e["delta"];
      if (d["type"] == "text_delta") block["text"] = block["text"].get<std::string>() + d["text"].get<std::string>();
      if (d["type"] == "thinking_delta") block["thinking"] = block["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      if (d["type"] == "signature_delta") block["signature"] = d["signature"];
      if (d["type"] == "input_json_delta") partial[e["index"].get<size_t>()] += d["partial_json"].get<std::string>();
    } else if (type == "content_block_stop") {
      nlohmann::json& block = message["content"][e["index"].get<size_t>()];
      if (block["type"] == "tool_use") block["input"] = nlohmann::json::parse(partial[e["index"].get<size_t>()]);
    } else if (type == "message_delta") {
      message["stop_reason"] = e["delta"]["stop_reason"];
      message["stop_sequence"] = e["delta"]["stop_sequence"];
      message["usage"] = e["usage"];
    }
  }
  return message;
}

TEST(MessagesOutput, StreamedEventsAddUpToTheMessage) {
  MessagesOutput out = messages_output();
  std::vector<nlohmann::json> events = out.on_start();
  for (const char* piece : {"Let me ", "check.\n</think>\n\nSure.\n<tool_call>\n<function=get_weather>\n",
                            "<parameter=city>\nParis\n</parameter>\n", "</function>\n</tool_call>"})
    for (auto& e : out.on_event(text_event(piece))) events.push_back(std::move(e));
  for (auto& e : out.on_event(end_event(FinishReason::stop))) events.push_back(std::move(e));
  std::vector<std::string> kinds;
  for (const auto& e : events) kinds.push_back(e["type"].get<std::string>() + (e.contains("delta") && e["delta"].contains("type") ? ":" + e["delta"]["type"].get<std::string>() : ""));
  EXPECT_EQ(kinds.front(), "message_start");
  EXPECT_EQ(kinds.back(), "message_stop");
  const nlohmann::json whole = out.response();
  EXPECT_EQ(replay(events)["content"], whole["content"]);
  ASSERT_EQ(whole["content"].size(), 3u);
  EXPECT_EQ(whole["content"][0]["thinking"], "Let me check.");
  EXPECT_EQ(reasoning_from_signature(whole["content"][0]["signature"].get<std::string>()), "Let me check.");
  EXPECT_EQ(whole["content"][1], nlohmann::json({{"type", "text"}, {"text", "Sure."}}));
  EXPECT_EQ(whole["content"][2]["name"], "get_weather");
  EXPECT_EQ(whole["content"][2]["input"], nlohmann::json({{"city", "Paris"}}));
  EXPECT_EQ(whole["stop_reason"], "tool_use");
  EXPECT_EQ(whole["usage"], nlohmann::json::parse(
      R"({"input_tokens":4,"cache_creation_input_tokens":0,"cache_read_input_tokens":96,"output_tokens":9})"));
  // The signature follows the thinking, before its block stops.
  auto at = [&](const std::string& k) { return std::find(kinds.begin(), kinds.end(), k) - kinds.begin(); };
  EXPECT_LT(at("content_block_delta:thinking_delta"), at("content_block_delta:signature_delta"));
  EXPECT_LT(at("content_block_delta:signature_delta"), at("content_block_stop"));
}

TEST(MessagesOutput, StopReasonsAndOmittedThinking) {
  MessagesOutput length = messages_output();
  length.on_event(text_event("</think>\n\nHello"));
  length.on_event(end_event(FinishReason::length));
  EXPECT_EQ(length.response()["stop_reason"], "max_tokens");

  MessagesOutput stop = messages_output();
  stop.on_event(text_event("</think>\n\nHello"));
  stop.on_event(end_event(FinishReason::stop, "END"));
  EXPECT_EQ(stop.response()["stop_reason"], "stop_sequence");
  EXPECT_EQ(stop.response()["stop_sequence"], "END");

  MessagesOutput hidden = messages_output(/*show_thinking=*/false);
  std::vector<nlohmann::json> events = hidden.on_event(text_event("secret\n</think>\n\nHi"));
  for (auto& e : hidden.on_event(end_event(FinishReason::stop))) events.push_back(std::move(e));
  for (const auto& e : events) EXPECT_FALSE(e.contains("delta") && e["delta"].value("type", "") == "thinking_delta");
  const nlohmann::json whole = hidden.response();
  EXPECT_EQ(whole["stop_reason"], "end_turn");
  EXPECT_EQ(whole["content"][0]["thinking"], "");
  EXPECT_EQ(reasoning_from_signature(whole["content"][0]["signature"].get<std::string>()), "secret");
}

TEST(MessagesOutput, ACancelledRequestEndsInAnErrorEvent) {
  MessagesOutput out = messages_output();
  out.on_event(text_event("</think>\n\nHel"));
  const std::vector<nlohmann::json> events = out.on_event(end_event(FinishReason::abort));
  ASSERT_EQ(events.size(), 2u);  // the open text block stops, then the error
  EXPECT_EQ(events[0]["type"], "content_block_stop");
  EXPECT_EQ(events[1]["type"], "error");
  EXPECT_EQ(events[1]["error"]["type"], "overloaded_error");
}

TEST(MessagesOutput, ErrorsHaveAnthropicsShape) {
  EXPECT_EQ(anthropic_error_json(ApiError(400, "invalid_request_error", "bad")),
            nlohmann::json::parse(R"({"type":"error","error":{"type":"invalid_request_error","message":"bad"}})"));
  EXPECT_EQ(anthropic_error_json(ApiError(413, "x", "big"))["error"]["type"], "request_too_large");
  EXPECT_EQ(anthropic_error_json(ApiError(500, "x", "oops"))["error"]["type"], "api_error");
}

}  // namespace
}  // namespace ellm
