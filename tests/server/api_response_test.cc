// Engine events -> OpenAI objects: streaming chunks and whole responses agree, tool calls and
// reasoning land in their fields, usage and finish reasons are right.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>

#include "server/api_response.h"
#include "server/metrics.h"

namespace ellm {
namespace {

using nlohmann::json;

StreamEvent text_event(std::string text, std::vector<int32_t> ids) {
  StreamEvent e;
  e.text = std::move(text);
  e.ids = std::move(ids);
  return e;
}

StreamEvent final_event(std::string text, FinishReason reason, int64_t prompt, int64_t completion, int64_t cached) {
  StreamEvent e = text_event(std::move(text), {});
  e.finished = true;
  e.finish_reason = reason;
  e.prompt_tokens = prompt;
  e.completion_tokens = completion;
  e.cached_tokens = cached;
  return e;
}

std::string token_name(int32_t id) { return "t" + std::to_string(id); }

json weather_tools() {
  return json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
}

ChatOutput make_chat(ToolCallFormat format, bool include_usage = false, bool logprobs = false) {
  ResponseMeta meta{"chatcmpl-1", "tiny", 123, include_usage, logprobs};
  return ChatOutput(meta, std::make_unique<OutputParser>(format, true, false, weather_tools()), token_name);
}

// Concatenates one string field of every chunk's delta.
std::string joined(const std::vector<json>& chunks, const char* key) {
  std::string out;
  for (const json& c : chunks)
    if (!c["choices"].empty() && c["choices"][0]["delta"].contains(key)) out += c["choices"][0]["delta"][key].get<std::string>();
  return out;
}

TEST(ChatOutput, StreamsRoleFirstThenContentThenFinishAndUsage) {
  ChatOutput out = make_chat(ToolCallFormat::hermes_json, /*include_usage=*/true);
  std::vector<json> chunks;
  for (const char* piece : {"Hel", "lo", " world"})
    for (json& c : out.on_event(text_event(piece, {1}))) chunks.push_back(std::move(c));
  for (json& c : out.on_event(final_event("!", FinishReason::length, 10, 4, 6))) chunks.push_back(std::move(c));

  ASSERT_GE(chunks.size(), 4u);
  EXPECT_EQ(chunks[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(joined(chunks, "content"), "Hello world!");
  const json& finish = chunks[chunks.size() - 2];
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length");
  const json& usage = chunks.back();
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 4);
  EXPECT_EQ(usage["usage"]["total_tokens"], 14);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 6);
  for (size_t i = 0; i + 2 < chunks.size(); i++) EXPECT_TRUE(chunks[i]["choices"][0]["finish_reason"].is_null());

  json whole = out.response();
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "Hello world!");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole["usage"]["total_tokens"], 14);
}

TEST(ChatOutput, ToolCallSplitAcrossEventsBecomesToolCallsWithFinishReason) {
  const std::string text = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  for (size_t split : {size_t{1}, size_t{5}, text.size()}) {
    ChatOutput out = make_chat(ToolCallFormat::hermes_json);
    std::vector<json> chunks;
    for (size_t i = 0; i < text.size(); i += split)
      for (json& c : out.on_event(text_event(text.substr(i, split), {1}))) chunks.push_back(std::move(c));
    for (json& c : out.on_event(final_event("", FinishReason::stop, 5, 20, 0))) chunks.push_back(std::move(c));

    EXPECT_EQ(joined(chunks, "content"), "Let me check.");
    std::string name, arguments, id;
    for (const json& c : chunks) {
      const json& delta = c["choices"][0]["delta"];
      if (!delta.contains("tool_calls")) continue;
      for (const json& call : delta["tool_calls"]) {
        EXPECT_EQ(call["index"], 0);
        if (call.contains("id")) {
          id = call["id"];
          EXPECT_EQ(call["type"], "function");
        }
        if (call["function"].contains("name")) name += call["function"]["name"].get<std::string>();
        arguments += call["function"]["arguments"].get<std::string>();
      }
    }
    EXPECT_FALSE(id.empty());
    EXPECT_EQ(name, "get_weather");
    EXPECT_EQ(json::parse(arguments), json({{"city", "Paris"}}));
    EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "tool_calls");

    json message = out.response()["choices"][0]["message"];
    EXPECT_EQ(message["content"], "Let me check.");
    ASSERT_EQ(message["tool_calls"].size(), 1u);
    EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(message["tool_calls"][0]["type"], "function");
    EXPECT_EQ(json::parse(message["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
    EXPECT_EQ(out.response()["choices"][0]["finish_reason"], "tool_calls");
  }
}

// OpenAI and vLLM send one entry per call index in a chunk; a step that completes a call's name
// and starts its arguments (or holds two whole calls) must not split one call over two entries.
TEST(ChatOutput, AChunkHoldsOneEntryPerCallIndex) {
  struct Case {
    ToolCallFormat format;
    std::string text;
  };
  const std::string coder_call = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
  const std::string qwen3_call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  for (const Case& c : {Case{ToolCallFormat::hermes_json, qwen3_call + "\n" + qwen3_call},
                        Case{ToolCallFormat::qwen3_coder_xml, coder_call + "\n" + coder_call}}) {
    for (size_t split : {size_t{1}, size_t{3}, size_t{40}, c.text.size()}) {
      auto parser = std::make_unique<OutputParser>(c.format, true, false, weather_tools());
      parser->stream_tool_calls();  // as the server sets it for a stream
      ChatOutput out(ResponseMeta{"chatcmpl-1", "tiny", 123, false, false}, std::move(parser), token_name);
      std::vector<json> chunks;
      for (size_t i = 0; i < c.text.size(); i += split)
        for (json& chunk : out.on_event(text_event(c.text.substr(i, split), {1}))) chunks.push_back(std::move(chunk));
      for (json& chunk : out.on_event(final_event("", FinishReason::stop, 5, 20, 0))) chunks.push_back(std::move(chunk));
      std::map<int, std::string> arguments, names;
      for (const json& chunk : chunks) {
        const json& delta = chunk["choices"][0]["delta"];
        if (!delta.contains("tool_calls")) continue;
        std::set<int> indices;
        for (const json& call : delta["tool_calls"]) {
          EXPECT_TRUE(indices.insert(call["index"].get<int>()).second) << "split " << split << ": " << delta.dump();
          if (call["function"].contains("name")) names[call["index"]] += call["function"]["name"].get<std::string>();
          arguments[call["index"]] += call["function"]["arguments"].get<std::string>();
        }
      }
      ASSERT_EQ(arguments.size(), 2u) << "split " << split;
      for (int i : {0, 1}) {
        EXPECT_EQ(names[i], "get_weather");
        EXPECT_EQ(json::parse(arguments[i]), json({{"city", "Paris"}})) << "split " << split;
      }
    }
  }
}

TEST(ChatOutput, ReasoningGoesToReasoningContent) {
  ChatOutput out = make_chat(ToolCallFormat::none);
  std::vector<json> chunks;
  for (const char* piece : {"<thi", "nk>ponder", "ing</th", "ink>\n\nAnswer"})
    for (json& c : out.on_event(text_event(piece, {1}))) chunks.push_back(std::move(c));
  for (json& c : out.on_event(final_event("", FinishReason::stop, 1, 4, 0))) chunks.push_back(std::move(c));
  EXPECT_EQ(joined(chunks, "reasoning_content"), "pondering");
  EXPECT_EQ(joined(chunks, "reasoning"), "pondering");
  EXPECT_EQ(joined(chunks, "content"), "Answer");
  json message = out.response()["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "pondering");
  EXPECT_EQ(message["content"], "Answer");
  EXPECT_FALSE(message.contains("tool_calls"));
  EXPECT_EQ(out.response()["choices"][0]["finish_reason"], "stop");
}

TEST(ChatOutput, LogprobsInChunksAndResponse) {
  ChatOutput out = make_chat(ToolCallFormat::none, false, /*logprobs=*/true);
  StreamEvent e = text_event("t7", {7});
  e.logprobs = {TokenLogprob{7, -0.5f, {{7, -0.5f}, {9, -1.5f}}}};
  std::vector<json> chunks = out.on_event(e);
  ASSERT_EQ(chunks.size(), 2u);  // role + token
  const json& lp = chunks[1]["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], "t7");
  EXPECT_FLOAT_EQ(lp["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(lp["bytes"], json({116, 55}));
  EXPECT_EQ(lp["top_logprobs"][1]["token"], "t9");
  out.on_event(final_event("", FinishReason::stop, 1, 1, 0));
  EXPECT_EQ(out.response()["choices"][0]["logprobs"]["content"].size(), 1u);
}

// A streaming output sends each token's logprobs once and keeps none for a whole response, so
// a client that stops reading costs its unsent chunks only.
TEST(ChatOutput, StreamingKeepsNoLogprobsBehind) {
  ChatOutput out(ResponseMeta{"chatcmpl-1", "tiny", 1, false, /*logprobs=*/true, /*streaming=*/true},
                 std::make_unique<OutputParser>(ToolCallFormat::none, true, false, json()), token_name);
  StreamEvent e = text_event("t7", {7});
  e.logprobs = {TokenLogprob{7, -0.5f, {{7, -0.5f}}}};
  std::vector<json> chunks = out.on_event(e);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[1]["choices"][0]["logprobs"]["content"].size(), 1u);
  out.on_event(final_event("", FinishReason::stop, 1, 1, 0));
  EXPECT_TRUE(out.response()["choices"][0]["logprobs"]["content"].empty());

  TextOutput text(ResponseMeta{"cmpl-1", "tiny", 1, false, true, true}, "", token_name);
  chunks = text.on_event(e);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["choices"][0]["logprobs"]["tokens"], json({"t7"}));
  text.on_event(final_event("", FinishReason::stop, 1, 1, 0));
  EXPECT_TRUE(text.response()["choices"][0]["logprobs"]["tokens"].empty());
}

TEST(TextOutput, StreamsTextWithEchoAndCompletionLogprobs) {
  TextOutput out(ResponseMeta{"cmpl-1", "tiny", 1, true, true}, "Prompt:", token_name);
  StreamEvent e = text_event(" a", {3});
  e.logprobs = {TokenLogprob{3, -0.25f, {{3, -0.25f}}}};
  std::vector<json> chunks = out.on_event(e);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["object"], "text_completion");
  EXPECT_EQ(chunks[0]["choices"][0]["text"], "Prompt: a");
  EXPECT_EQ(chunks[0]["choices"][0]["logprobs"]["tokens"], json({"t3"}));
  chunks = out.on_event(final_event(" b", FinishReason::stop, 3, 2, 1));
  ASSERT_EQ(chunks.size(), 3u);  // text, finish, usage
  EXPECT_EQ(chunks[1]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(chunks[2]["usage"]["completion_tokens"], 2);
  json whole = out.response();
  EXPECT_EQ(whole["choices"][0]["text"], "Prompt: a b");
  EXPECT_EQ(whole["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
  EXPECT_EQ(whole["choices"][0]["logprobs"]["token_logprobs"], json({-0.25}));
}

// stream_options.continuous_usage_stats: every chunk carries the counts so far (vLLM).
TEST(ChatOutput, ContinuousUsageOnEveryChunk) {
  ResponseMeta meta{"chatcmpl-1", "tiny", 123, /*include_usage=*/true, false, /*streaming=*/true};
  meta.continuous_usage = true;
  meta.prompt_tokens = 10;
  ChatOutput out(meta, std::make_unique<OutputParser>(ToolCallFormat::none, true, false, weather_tools()), token_name);
  std::vector<json> chunks;
  for (const char* piece : {"Hel", "lo"})
    for (json& c : out.on_event(text_event(piece, {1, 2}))) chunks.push_back(std::move(c));
  for (json& c : out.on_event(final_event("", FinishReason::length, 10, 5, 3))) chunks.push_back(std::move(c));
  std::vector<int64_t> completion;
  for (const json& c : chunks) {
    ASSERT_TRUE(c.contains("usage")) << c.dump();
    EXPECT_EQ(c["usage"]["prompt_tokens"], 10);
    EXPECT_EQ(c["usage"]["total_tokens"], 10 + c["usage"]["completion_tokens"].get<int64_t>());
    completion.push_back(c["usage"]["completion_tokens"]);
  }
  // role + "Hel" (2 tokens), "lo" (4), finish (5, the stop token counted), final usage chunk (5).
  EXPECT_EQ(completion, (std::vector<int64_t>{2, 2, 4, 5, 5}));
  EXPECT_EQ(chunks.back()["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
}

// The tokens that become a tool call keep their logprobs, streamed and in the whole response.
TEST(ChatOutput, ToolCallTokensKeepTheirLogprobs) {
  const std::string text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  ChatOutput out = make_chat(ToolCallFormat::hermes_json, false, /*logprobs=*/true);
  size_t streamed = 0, events = 0;
  for (size_t i = 0; i < text.size(); i += 7, events++) {
    StreamEvent e = text_event(text.substr(i, 7), {int32_t(i)});
    e.logprobs.push_back(TokenLogprob{int32_t(i), -0.5f, {}});
    for (const json& c : out.on_event(e))
      if (c["choices"][0]["logprobs"].is_object()) streamed += c["choices"][0]["logprobs"]["content"].size();
  }
  out.on_event(final_event("", FinishReason::stop, 5, int64_t(events), 0));
  json whole = out.response();
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(whole["choices"][0]["logprobs"]["content"].size(), events);
  EXPECT_EQ(streamed, events);
}

TEST(ErrorJson, OpenAiShape) {
  json e = error_json(ApiError(404, "not_found_error", "no such model", "model"));
  EXPECT_EQ(e["error"]["message"], "no such model");
  EXPECT_EQ(e["error"]["type"], "not_found_error");
  EXPECT_EQ(e["error"]["param"], "model");
  EXPECT_EQ(e["error"]["code"], 404);
  EXPECT_TRUE(error_json(ApiError(400, "invalid_request_error", "x"))["error"]["param"].is_null());
}

TEST(Metrics, PrometheusTextHasCountersAndCumulativeHistograms) {
  EngineMetrics m;
  m.requests_running = 2;
  m.prompt_tokens_total = 100;
  m.cached_tokens_total = 40;
  m.recomputed_tokens_total = 12;
  m.kv_resident_bytes = 4096;
  m.kv_bytes_per_token = 59136;
  m.kv_dtype = "int8";
  m.time_to_first_token = {{0.1, 1.0}, {1, 3, 4}, 2.5, 4};
  HttpCounters http;
  http.count("/v1/models", 200);
  http.count("/v1/models", 200);
  std::string text = prometheus_text(m, http, "tiny \"q\"");
  EXPECT_NE(text.find("ellm:num_requests_running{model_name=\"tiny \\\"q\\\"\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("ellm:prompt_tokens_total{model_name=\"tiny \\\"q\\\"\"} 100\n"), std::string::npos);
  EXPECT_NE(text.find("ellm:session_cache_hit_tokens_total{model_name=\"tiny \\\"q\\\"\"} 40\n"), std::string::npos);
  EXPECT_NE(text.find("ellm:session_cache_recomputed_tokens_total{model_name=\"tiny \\\"q\\\"\"} 12\n"), std::string::npos);
  EXPECT_NE(text.find("ellm:kv_cache_resident_bytes{model_name=\"tiny \\\"q\\\"\"} 4096\n"), std::string::npos);
  EXPECT_NE(text.find("ellm:kv_cache_bytes_per_token{model_name=\"tiny \\\"q\\\"\",dtype=\"int8\"} 59136\n"), std::string::npos);
  EXPECT_NE(text.find("ellm:time_to_first_token_seconds_bucket{model_name=\"tiny \\\"q\\\"\",le=\"0.1\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("le=\"+Inf\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("ellm:time_to_first_token_seconds_count{model_name=\"tiny \\\"q\\\"\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE ellm:e2e_request_latency_seconds histogram"), std::string::npos);
  EXPECT_NE(text.find("ellm:http_responses_total{route=\"/v1/models\",status=\"200\"} 2\n"), std::string::npos);
}

TEST(Metrics, EverySampleCarriesTheReplicaLabel) {
  EngineMetrics m;
  m.requests_running = 1;
  m.time_to_first_token = {{0.1}, {1, 1}, 0.05, 1};
  HttpCounters http;
  http.count("/health", 200);
  std::string text = prometheus_text(m, http, "tiny", "r-1");
  EXPECT_NE(text.find("ellm:num_requests_running{model_name=\"tiny\",replica=\"r-1\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("ellm:sessions{model_name=\"tiny\",replica=\"r-1\",tier=\"hot\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("ellm:http_responses_total{route=\"/health\",status=\"200\",replica=\"r-1\"} 1\n"), std::string::npos) << text;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] != '#') EXPECT_NE(line.find("replica=\"r-1\""), std::string::npos) << line;
}

}  // namespace
}  // namespace ellm
