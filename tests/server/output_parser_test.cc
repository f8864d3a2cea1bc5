// OutputParser: every case is parsed whole, byte by byte, code point by code point and in random
// chunks, with tool calls sent whole and streamed (stream_tool_calls); all splits must give the
// same exact result, and the deltas must add up to it.
#include "server/output_parser.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "base/error.h"
#include "server/tool_parser.h"

namespace ellm {
namespace {

using nlohmann::json;

struct Options {
  ToolCallFormat format = ToolCallFormat::hermes_json;
  bool reasoning = true;
  bool starts_in_reasoning = false;
  json tools = nullptr;
  bool stream_calls = false;
};

struct Expected {
  std::string content, reasoning;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

const json kWeatherTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
  {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"},
                   "mode": {"type": "integer"}, "ratio": {"type": "number"},
                   "force": {"type": "boolean"}, "options": {"type": "object"},
                   "tags": {"type": "array"}, "limit": {"type": ["integer", "null"]}}}}}
])");

// Splits text into pieces: whole, every byte, every UTF-8 code point, and random chunks.
std::vector<std::vector<std::string>> splits(const std::string& text) {
  std::vector<std::vector<std::string>> all;
  all.push_back({text});
  std::vector<std::string> bytes, code_points;
  for (char c : text) bytes.emplace_back(1, c);
  for (size_t i = 0; i < text.size();) {
    size_t n = 1;
    while (i + n < text.size() && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;
    code_points.push_back(text.substr(i, n));
    i += n;
  }
  all.push_back(bytes);
  all.push_back(code_points);
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    std::vector<std::string> chunks;
    for (size_t i = 0; i < text.size();) {
      size_t n = std::uniform_int_distribution<size_t>(0, 12)(rng);
      chunks.push_back(text.substr(i, n));
      i += n;
    }
    all.push_back(chunks);
  }
  return all;
}

// Runs one split through a parser; checks the deltas add up to result(); returns the result.
ParsedOutput run(const Options& options, const std::vector<std::string>& chunks) {
  OutputParser parser(options.format, options.reasoning, options.starts_in_reasoning,
                      options.tools);
  if (options.stream_calls) parser.stream_tool_calls();
  ParsedOutput streamed;
  auto add = [&](const OutputDelta& delta) {
    streamed.content += delta.content;
    streamed.reasoning += delta.reasoning;
    for (const auto& call : delta.tool_calls) {
      if (call.index == static_cast<int>(streamed.tool_calls.size())) {
        EXPECT_FALSE(call.id.empty());
        EXPECT_FALSE(call.name.empty());
        streamed.tool_calls.push_back({call.id, call.name, ""});
      } else {
        EXPECT_EQ(call.index + 1, static_cast<int>(streamed.tool_calls.size()));
        EXPECT_TRUE(call.id.empty() && call.name.empty());
      }
      streamed.tool_calls.at(call.index).arguments += call.arguments;
    }
  };
  for (const auto& chunk : chunks) add(parser.push(chunk));
  add(parser.finish());
  const ParsedOutput& result = parser.result();
  EXPECT_EQ(streamed.content, result.content);
  EXPECT_EQ(streamed.reasoning, result.reasoning);
  EXPECT_EQ(streamed.tool_calls.size(), result.tool_calls.size());
  for (size_t i = 0; i < std::min(streamed.tool_calls.size(), result.tool_calls.size()); ++i) {
    EXPECT_EQ(streamed.tool_calls[i].id, result.tool_calls[i].id);
    EXPECT_EQ(streamed.tool_calls[i].name, result.tool_calls[i].name);
    EXPECT_EQ(streamed.tool_calls[i].arguments, result.tool_calls[i].arguments);
  }
  return result;
}

// `streamed`: the result when calls are streamed, if it differs (a call that goes wrong after
// its name was sent stays a call).
void expect_parse(const std::string& text, Options options, const Expected& expected,
                  const Expected* streamed = nullptr) {
  for (bool stream : {false, true}) {
    options.stream_calls = stream;
    const Expected& want = stream && streamed ? *streamed : expected;
    for (const auto& chunks : splits(text)) {
      SCOPED_TRACE(std::string(stream ? "streamed calls, " : "") + "split into " + std::to_string(chunks.size()) + " pieces");
      ParsedOutput result = run(options, chunks);
      EXPECT_EQ(result.content, want.content);
      EXPECT_EQ(result.reasoning, want.reasoning);
      ASSERT_EQ(result.tool_calls.size(), want.calls.size());
      for (size_t i = 0; i < want.calls.size(); ++i) {
        EXPECT_EQ(result.tool_calls[i].name, want.calls[i].first);
        EXPECT_EQ(result.tool_calls[i].arguments, want.calls[i].second);
      }
      if (::testing::Test::HasFailure()) return;  // one report per case is enough
    }
  }
  for (const auto& call : expected.calls) EXPECT_TRUE(json::accept(call.second)) << call.second;
}

std::string hermes(const std::string& name, const std::string& arguments) {
  return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + arguments +
         "}\n</tool_call>";
}

// ---- plain text and reasoning ----

TEST(OutputParser, PlainTextPassesThroughUnchanged) {
  std::string text = "Hello, world!\n\n  Indented <b>bold</b> a < b > c\n";
  expect_parse(text, {ToolCallFormat::none, false}, {text, "", {}});
  expect_parse(text, {}, {text, "", {}});
  expect_parse("\n\n", {}, {"\n\n", "", {}});
  expect_parse("", {}, {"", "", {}});
}

TEST(OutputParser, ThinkBlockGoesToReasoning) {
  expect_parse("<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello! 👋",
               {}, {"Hello! 👋", "The user greets me.\nI greet back.", {}});
  expect_parse("<think>\n\n</think>\n\nShort.", {}, {"Short.", "", {}});
}

TEST(OutputParser, StartsInReasoning) {
  Options options;
  options.starts_in_reasoning = true;
  expect_parse("Let me think: 2+2=4.\n</think>\n\nIt is 4.", options,
               {"It is 4.", "Let me think: 2+2=4.", {}});
}

TEST(OutputParser, CutOffReasoningStaysReasoning) {
  expect_parse("<think>\nStill thinking about </thi", {}, {"", "Still thinking about </thi", {}});
}

TEST(OutputParser, ThinkTagsAreTextWhenReasoningIsOffOrMidContent) {
  std::string text = "<think>x</think>y";
  expect_parse(text, {ToolCallFormat::hermes_json, false}, {text, "", {}});
  expect_parse("Answer: <think>x</think>", {}, {"Answer: <think>x</think>", "", {}});
  expect_parse("  <thin", {}, {"  <thin", "", {}});
}

// ---- hermes (Qwen3) ----

TEST(HermesToolCalls, SingleCall) {
  expect_parse(hermes("get_weather", R"({"city": "Paris", "days": 3})"), {},
               {"", "", {{"get_weather", R"({"city": "Paris", "days": 3})"}}});
}

TEST(HermesToolCalls, TextBeforeAndAfterAndSeveralCalls) {
  std::string text = "Let me check both.\n\n" + hermes("get_weather", R"({"city": "Paris"})") +
                     "\n" + hermes("get_weather", R"({"city": "Tōkyō 東京"})") +
                     "\n\nDone.";
  expect_parse(text, {ToolCallFormat::hermes_json, true, false, kWeatherTools},
               {"Let me check both.\n\nDone.", "",
                {{"get_weather", R"({"city": "Paris"})"},
                 {"get_weather", R"({"city": "Tōkyō 東京"})"}}});
}

// The arguments are the object's text as the model wrote it (so a stream can send it as it grows).
TEST(HermesToolCalls, ArgumentsAreTheObjectAsWritten) {
  std::string arguments =
      R"({"zeta": {"list": [1, 2.5, {"deep": [true, null]}], "s": "quote \" and <tool_call> \n"}, "alpha": -7})";
  expect_parse(hermes("write_file", arguments), {},
               {"", "", {{"write_file", arguments}}});
}

TEST(HermesToolCalls, ArgumentsAsJsonStringOrMissing) {
  expect_parse(R"(<tool_call>{"name": "f", "arguments": "{\"x\": 1}"}</tool_call>)", {},
               {"", "", {{"f", R"({"x":1})"}}});
  expect_parse(R"(<tool_call>{"name": "f"}</tool_call>)", {}, {"", "", {{"f", "{}"}}});
}

// Layouts other than {"name", "arguments": {...}} are parsed whole (and so not streamed): their
// arguments are the compact JSON of the object.
TEST(HermesToolCalls, OtherLayoutsAreParsedWhole) {
  expect_parse(R"(<tool_call>{"arguments": {"city": "Oslo"}, "name": "get_weather"}</tool_call>)", {},
               {"", "", {{"get_weather", R"({"city":"Oslo"})"}}});
  expect_parse(R"(<tool_call>{"name": "get_weather", "parameters": {"city": "Oslo"}}</tool_call>)", {},
               {"", "", {{"get_weather", R"({"city":"Oslo"})"}}});
  // A key after the arguments: still one valid call, the arguments as written.
  expect_parse(R"(<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": 7}</tool_call>)", {},
               {"", "", {{"get_weather", R"({"city": "Oslo"})"}}});
}

TEST(HermesToolCalls, ThinkThenCall) {
  std::string text = "<think>\nI need the weather.\n</think>\n\n" +
                     hermes("get_weather", R"({"city": "Oslo"})");
  expect_parse(text, {}, {"", "I need the weather.", {{"get_weather", R"({"city": "Oslo"})"}}});
}

TEST(HermesToolCalls, CallInsideReasoningIsReasoning) {
  std::string inner = hermes("get_weather", R"({"city": "Oslo"})");
  expect_parse("<think>\nMaybe " + inner + "\n</think>\n\nNo.", {}, {"No.", "Maybe " + inner, {}});
}

TEST(HermesToolCalls, CompleteCallMissingOnlyItsClosingTag) {
  expect_parse("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n", {},
               {"", "", {{"f", R"({"a": 1})"}}});
}

TEST(HermesToolCalls, MalformedFallsBackToVerbatimText) {
  // Cut off mid-call.
  std::string cut = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"argu";
  expect_parse(cut, {}, {cut, "", {}});
  // Invalid JSON, then more text.
  std::string bad = "A\n<tool_call>\n{name: get_weather}\n</tool_call>\nB";
  expect_parse(bad, {}, {bad, "", {}});
  // Arguments that are not an object.
  std::string not_object = R"(<tool_call>{"name": "f", "arguments": [1]}</tool_call>)";
  expect_parse(not_object, {}, {not_object, "", {}});
  // A raw NUL after the JSON object (which nlohmann alone would take for the end of input).
  // Streamed, its name and arguments went out before the NUL: the call stands as sent.
  std::string nul = std::string("<tool_call>{\"name\": \"f\", \"arguments\": {}}") + '\0' + "x</tool_call>";
  const Expected sent{"", "", {{"f", "{}"}}};
  expect_parse(nul, {}, {nul, "", {}}, &sent);
  // A partial opening tag at the very end.
  expect_parse("Hello <tool_ca", {}, {"Hello <tool_ca", "", {}});
}

TEST(HermesToolCalls, UnknownFunctionIsTextWhenToolsAreGiven) {
  std::string text = hermes("rm_rf", R"({"path": "/"})");
  expect_parse(text, {ToolCallFormat::hermes_json, true, false, kWeatherTools}, {text, "", {}});
  expect_parse(text, {}, {"", "", {{"rm_rf", R"({"path": "/"})"}}});  // no tools: no check
}

TEST(HermesToolCalls, ValidCallAfterInvalidOne) {
  std::string bad = "<tool_call>{oops}</tool_call>";
  expect_parse(bad + "\n" + hermes("f", "{}"), {}, {bad, "", {{"f", "{}"}}});
}

TEST(HermesToolCalls, FormatNoneLeavesCallsAsText) {
  std::string text = hermes("f", "{}");
  expect_parse(text, {ToolCallFormat::none}, {text, "", {}});
}

// ---- Qwen3-Coder XML ----

Options coder(json tools = kWeatherTools) {
  return {ToolCallFormat::qwen3_coder_xml, true, false, std::move(tools)};
}

TEST(CoderToolCalls, SingleCallWithStringParameter) {
  expect_parse(
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
      "<parameter=days>\n5\n</parameter>\n</function>\n</tool_call>",
      coder(), {"", "", {{"get_weather", R"({"city":"San Francisco","days":5})"}}});
}

TEST(CoderToolCalls, ParameterTypesFollowTheSchema) {
  expect_parse(
      "<tool_call>\n<function=write_file>\n"
      "<parameter=path>\n123\n</parameter>\n"
      "<parameter=mode>\n644\n</parameter>\n"
      "<parameter=ratio>\n0.25\n</parameter>\n"
      "<parameter=force>\nTrue\n</parameter>\n"
      "<parameter=options>\n{\"b\": [1, {\"c\": null}], \"a\": \"x\"}\n</parameter>\n"
      "<parameter=tags>\n[\"x\", \"y\"]\n</parameter>\n"
      "<parameter=limit>\nnull\n</parameter>\n"
      "<parameter=extra>\n42\n</parameter>\n"
      "</function>\n</tool_call>",
      coder(),
      {"", "", {{"write_file",
         R"({"path":"123","mode":644,"ratio":0.25,"force":true,"options":{"b":[1,{"c":null}],"a":"x"},"tags":["x","y"],"limit":null,"extra":"42"})"}}});
}

TEST(CoderToolCalls, MultiLineStringKeepsInnerNewlinesAndMarkup) {
  std::string code = "def f():\n    return \"<div>ü</div>\"\n\n";
  expect_parse("I'll write it.\n<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n"
               "</parameter>\n<parameter=content>\n" + code + "\n</parameter>\n</function>\n"
               "</tool_call>",
               coder(),
               {"I'll write it.", "",
                {{"write_file", nlohmann::ordered_json({{"path", "/tmp/a.py"}, {"content", code}}).dump()}}});
}

TEST(CoderToolCalls, SeveralCallsAndReasoning) {
  std::string call_a =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
      "</tool_call>";
  std::string call_b =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n"
      "</tool_call>";
  expect_parse("<think>\nTwo cities.\n</think>\n\n" + call_a + "\n" + call_b, coder(),
               {"", "Two cities.",
                {{"get_weather", R"({"city":"Paris"})"}, {"get_weather", R"({"city":"Rome"})"}}});
}

TEST(CoderToolCalls, MissingParameterCloseTagAndNoParameters) {
  expect_parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nLima\n<parameter=days>\n2\n"
               "</function>\n</tool_call>",
               coder(), {"", "", {{"get_weather", R"({"city":"Lima","days":2})"}}});
  expect_parse("<tool_call>\n<function=ping>\n</function>\n</tool_call>", coder(nullptr),
               {"", "", {{"ping", "{}"}}});
}

TEST(CoderToolCalls, MalformedFallsBackToVerbatimText) {
  std::string cut = "Hm.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
  const Expected cut_streamed{"Hm.", "", {{"get_weather", "{"}}};  // what went out
  expect_parse(cut, coder(), {cut, "", {}}, &cut_streamed);
  std::string unknown =
      "<tool_call>\n<function=launch>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>";
  expect_parse(unknown + " ok", coder(), {unknown + " ok", "", {}});
  std::string no_function = "<tool_call>\nget_weather(city=Paris)\n</tool_call>";
  expect_parse(no_function, coder(), {no_function, "", {}});
}

TEST(CoderToolCalls, ParameterValueConversion) {
  EXPECT_EQ(convert_parameter_value("5.0", "number"), 5);
  EXPECT_EQ(convert_parameter_value("-1.5e2", "number"), -150);
  EXPECT_EQ(convert_parameter_value("1.5", "float"), 1.5);
  EXPECT_EQ(convert_parameter_value("nan", "number"), "nan");
  EXPECT_EQ(convert_parameter_value("12", "integer"), 12);
  EXPECT_EQ(convert_parameter_value("+12", "int"), 12);
  EXPECT_EQ(convert_parameter_value("twelve", "integer"), "twelve");
  EXPECT_EQ(convert_parameter_value("1.5", "integer"), "1.5");
  EXPECT_EQ(convert_parameter_value("FALSE", "boolean"), false);
  EXPECT_EQ(convert_parameter_value("maybe", "boolean"), "maybe");
  EXPECT_TRUE(convert_parameter_value("NULL", "string").is_null());
  EXPECT_EQ(convert_parameter_value("{\"a\": 1}", "object").dump(), json::parse("{\"a\": 1}").dump());
  EXPECT_EQ(convert_parameter_value("[1, ", "array"), "[1, ");
  EXPECT_EQ(convert_parameter_value(" 42 ", "string"), " 42 ");
}

// ---- ids, formats, lifecycle ----

TEST(OutputParser, CallIdsAreUniqueAndWellFormed) {
  OutputParser parser(ToolCallFormat::hermes_json, true, false, nullptr);
  parser.push(hermes("a", "{}") + hermes("b", "{}") + hermes("c", "{}"));
  parser.finish();
  const auto& calls = parser.result().tool_calls;
  ASSERT_EQ(calls.size(), 3u);
  for (const auto& call : calls) {
    ASSERT_EQ(call.id.size(), 5u + 24u);
    EXPECT_EQ(call.id.substr(0, 5), "call_");
    for (char c : call.id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)));
  }
  EXPECT_NE(calls[0].id, calls[1].id);
  EXPECT_NE(calls[1].id, calls[2].id);
}

TEST(OutputParser, PushAfterFinishIsIgnored) {
  OutputParser parser(ToolCallFormat::hermes_json, true, false, nullptr);
  parser.push("a");
  parser.finish();
  EXPECT_TRUE(parser.push("b").empty());
  EXPECT_TRUE(parser.finish().empty());
  EXPECT_EQ(parser.result().content, "a");
}

TEST(OutputParser, FormatByName) {
  EXPECT_EQ(tool_call_format_by_name("hermes"), ToolCallFormat::hermes_json);
  EXPECT_EQ(tool_call_format_by_name("qwen3"), ToolCallFormat::hermes_json);
  EXPECT_EQ(tool_call_format_by_name("qwen3_coder"), ToolCallFormat::qwen3_coder_xml);
  EXPECT_EQ(tool_call_format_by_name("none"), ToolCallFormat::none);
  EXPECT_THROW(tool_call_format_by_name("mistral"), Error);
}

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

TEST(OutputParser, FormatDetectedFromTheSharedTemplates) {
  std::string shared = ELLM_SHARED;
  std::string qwen3 = read_text(shared + "/text/qwen3/chat_template.jinja");
  std::string coder = read_text(shared + "/text/qwen3-coder/chat_template.jinja");
  ASSERT_FALSE(qwen3.empty());
  ASSERT_FALSE(coder.empty());
  EXPECT_EQ(detect_tool_call_format(qwen3), ToolCallFormat::hermes_json);
  EXPECT_EQ(detect_tool_call_format(coder), ToolCallFormat::qwen3_coder_xml);
  EXPECT_EQ(detect_tool_call_format("{{ messages }}"), ToolCallFormat::none);
}

TEST(OutputParser, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_reasoning(""));
}

}  // namespace
}  // namespace ellm

namespace ellm {
namespace {

// stream_tool_calls on free output (tool_choice auto), pushed a byte at a time: the text before
// the call streams as content first; the call's id and name come alone as soon as its name is
// known, then its arguments in several fragments which add up to exactly the arguments the whole
// parse (calls not streamed) of the same text reports.
void check_streamed_call(ToolCallFormat format, const std::string& before, const std::string& call,
                         const std::string& name, const nlohmann::json& arguments) {
  const std::string text = before + call;
  OutputParser whole(format, true, false, kWeatherTools);
  whole.push(text);
  whole.finish();
  ASSERT_EQ(whole.result().tool_calls.size(), 1u) << text;

  OutputParser parser(format, true, false, kWeatherTools);
  parser.stream_tool_calls();
  std::vector<ToolCallDelta> deltas;
  std::string content;
  size_t header_at = 0;  // bytes pushed when the header came
  auto take = [&](OutputDelta d, size_t pushed) {
    if (!d.content.empty()) EXPECT_TRUE(deltas.empty()) << "content after the call began: " << d.content;
    content += d.content;
    for (auto& t : d.tool_calls) {
      if (deltas.empty()) header_at = pushed;
      deltas.push_back(t);
    }
  };
  for (size_t i = 0; i < text.size(); ++i) take(parser.push(text.substr(i, 1)), i + 1);
  take(parser.finish(), text.size());
  ASSERT_GE(deltas.size(), 3u) << text;
  EXPECT_FALSE(deltas[0].id.empty());
  EXPECT_EQ(deltas[0].name, name);
  EXPECT_EQ(deltas[0].arguments, "");
  // The header goes out once the name is read, well before the call's end.
  EXPECT_LT(header_at, before.size() + call.find(name) + name.size() + 20);
  std::string joined;
  for (size_t i = 1; i < deltas.size(); ++i) {
    EXPECT_TRUE(deltas[i].id.empty() && deltas[i].name.empty());
    EXPECT_EQ(deltas[i].index, 0);
    EXPECT_FALSE(deltas[i].arguments.empty());
    joined += deltas[i].arguments;
  }
  EXPECT_EQ(joined, whole.result().tool_calls[0].arguments);
  EXPECT_EQ(nlohmann::json::parse(joined), arguments);
  EXPECT_EQ(content, whole.result().content);
  ASSERT_EQ(parser.result().tool_calls.size(), 1u);
  EXPECT_EQ(parser.result().tool_calls[0].arguments, joined);
}

TEST(StreamedToolCalls, HermesArgumentsGrowWithTheText) {
  check_streamed_call(ToolCallFormat::hermes_json, "",
                      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa}ris\\\"\", \"days\": 3}}\n</tool_call>",
                      "get_weather", {{"city", "Pa}ris\""}, {"days", 3}});
  check_streamed_call(ToolCallFormat::hermes_json, "Let me look that up.\n\n",
                      "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"a</tool_call>.txt\", "
                      "\"options\": {\"x\": [1, {\"y\": null}]}, \"mode\": 420}}\n</tool_call>",
                      "write_file", {{"path", "a</tool_call>.txt"}, {"options", {{"x", {1, {{"y", nullptr}}}}}}, {"mode", 420}});
}

TEST(StreamedToolCalls, CoderSendsAParameterAtATime) {
  check_streamed_call(ToolCallFormat::qwen3_coder_xml, "",
                      "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
                      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
                      "get_weather", {{"city", "New York"}, {"days", 3}});
  check_streamed_call(ToolCallFormat::qwen3_coder_xml, "I'll write the file.\n",
                      "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/x\n</parameter>\n"
                      "<parameter=content>\nline 1\n<b>line 2</b>\n</parameter>\n<parameter=force>\ntrue\n</parameter>\n"
                      "</function>\n</tool_call>",
                      "write_file", {{"path", "/tmp/x"}, {"content", "line 1\n<b>line 2</b>"}, {"force", true}});
}

// A streamed call that goes wrong after its name went out cannot be taken back: it stands with
// what was sent, the rest of its block is dropped, and what follows the block is read as usual.
// Not streamed, the same block is content.
TEST(StreamedToolCalls, ACallThatGoesWrongAfterItsNameStandsAsSent) {
  const std::string broken = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"\n</tool_call>";
  const std::string good = hermes("get_weather", R"({"city": "Rome"})");
  const Options tools{ToolCallFormat::hermes_json, true, false, kWeatherTools};
  const Expected streamed{"\nThen.", "", {{"get_weather", "{\"city\": \"Oslo\"\n"}, {"get_weather", R"({"city": "Rome"})"}}};
  expect_parse(broken + "\nThen.\n" + good, tools, {broken + "\nThen.", "", {{"get_weather", R"({"city": "Rome"})"}}}, &streamed);
  // Balanced braces but not JSON.
  const std::string bad_json = hermes("get_weather", R"({"city": Oslo})");
  const Expected bad_json_streamed{"", "", {{"get_weather", R"({"city": Oslo})"}}};
  expect_parse(bad_json, tools, {bad_json, "", {}}, &bad_json_streamed);
  // Qwen3-Coder: the second function of a block is unknown.
  const std::string coder_block = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
                                  "<function=launch>\n</function>\n</tool_call>";
  const Expected coder_streamed{"ok", "", {{"get_weather", R"({"city":"Oslo"})"}}};
  expect_parse(coder_block + "ok", coder(), {coder_block + "ok", "", {}}, &coder_streamed);
}

TEST(StreamedToolCalls, SeveralCallsPushedAtOnce) {
  OutputParser parser(ToolCallFormat::hermes_json, true, false, kWeatherTools);
  parser.stream_tool_calls();
  OutputDelta d = parser.push(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>");
  parser.finish();
  ASSERT_EQ(parser.result().tool_calls.size(), 2u);
  EXPECT_EQ(parser.result().tool_calls[0].arguments, "{\"city\": \"A\"}");
  EXPECT_EQ(parser.result().tool_calls[1].arguments, "{}");
  ASSERT_EQ(d.tool_calls.size(), 4u);  // each header alone, then its arguments
  EXPECT_TRUE(d.tool_calls[0].arguments.empty() && d.tool_calls[1].id.empty());
  EXPECT_EQ(parser.result().content, "");
}

TEST(StreamedToolCalls, TextThatIsNoCallStaysText) {
  OutputParser parser(ToolCallFormat::hermes_json, true, false, kWeatherTools);
  parser.stream_tool_calls();
  std::string text = "<tool_call>\nnot json\n</tool_call>";
  for (char c : text) parser.push(std::string(1, c));
  parser.finish();
  EXPECT_TRUE(parser.result().tool_calls.empty());
  EXPECT_EQ(parser.result().content, text);
}

}  // namespace
}  // namespace ellm
