// ChatTemplate: where the template comes from, what the context holds, and vLLM's message
// normalisation.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/chat_template.h"

namespace ellm {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("ellm_chat_template_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream((path_ / name).string(), std::ios::binary) << text;
    return (path_ / name).string();
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

const ojson kUser = ojson::parse(R"([{"role": "user", "content": "hi"}])");

TEST(ChatTemplateLoad, PrefersJinjaFileThenConfigStringAndOverrideWinsOverBoth) {
  TempDir dir;
  dir.file("tokenizer_config.json", R"({"chat_template": "config:{{ messages[0].content }}", "eos_token": "<e>"})");
  EXPECT_EQ(ChatTemplate::load(dir.path()).render(kUser, nullptr, false), "config:hi");
  dir.file("chat_template.jinja", "file:{{ messages[0].content }}{{ eos_token }}\n");
  EXPECT_EQ(ChatTemplate::load(dir.path()).render(kUser, nullptr, false), "file:hi<e>");
  std::string override_file = dir.file("other.jinja", "override:{{ add_generation_prompt }}");
  EXPECT_EQ(ChatTemplate::load(dir.path(), override_file).render(kUser, nullptr, true), "override:True");
}

TEST(ChatTemplateLoad, NamedTemplateListUsesDefaultAndToolUseWhenToolsAreGiven) {
  TempDir dir;
  dir.file("tokenizer_config.json", R"({"chat_template": [
      {"name": "default", "template": "plain"},
      {"name": "tool_use", "template": "tools:{{ tools | length }}"}],
    "bos_token": {"content": "<s>", "lstrip": false}})");
  ChatTemplate t = ChatTemplate::load(dir.path());
  EXPECT_EQ(t.source(), "plain");
  EXPECT_EQ(t.render(kUser, nullptr, true), "plain");
  EXPECT_EQ(t.render(kUser, ojson::parse(R"([{"type": "function"}])"), true), "tools:1");
}

TEST(ChatTemplateLoad, ClearErrors) {
  TempDir dir;
  EXPECT_THROW(ChatTemplate::load(dir.path()), Error);  // no template anywhere
  dir.file("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "x"}]})");
  try {
    ChatTemplate::load(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no template named \"default\""), std::string::npos) << e.what();
  }
  dir.file("tokenizer_config.json", "{not json");
  EXPECT_THROW(ChatTemplate::load(dir.path()), Error);
  dir.file("tokenizer_config.json", "{}");
  dir.file("chat_template.jinja", "{{ x | bogus }}");
  try {
    ChatTemplate::load(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), dir.path() + "/chat_template.jinja:1: unknown filter 'bogus'");
  }
  EXPECT_THROW(ChatTemplate::load(dir.path(), dir.path() + "/missing.jinja"), Error);
}

TEST(ChatTemplateRender, KwargsReachTheTemplateButCannotReplaceMessages) {
  ChatTemplate t = ChatTemplate::from_source(
      "{{ messages | length }} {{ enable_thinking }} {{ tools }} {{ custom is defined }}");
  ojson extra = {{"enable_thinking", false}, {"messages", "ignored"}};
  EXPECT_EQ(t.render(kUser, nullptr, true, extra), "1 False None False");
}

TEST(ChatTemplateRender, KeyOrderOfToolsIsPreserved) {
  ChatTemplate t = ChatTemplate::from_source("{{ tools[0] | tojson }}");
  ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "f", "a": 1}}])");
  EXPECT_EQ(t.render(kUser, tools, false), R"({"type": "function", "function": {"name": "f", "a": 1}})");
  // Plain nlohmann::json sorts keys on parse; that overload still renders (sorted).
  nlohmann::json sorted_tools = nlohmann::json::parse(tools.dump());
  EXPECT_EQ(t.render(nlohmann::json(kUser), sorted_tools, false),
            R"({"function": {"a": 1, "name": "f"}, "type": "function"})");
}

TEST(NormalizeChatMessages, FollowsVllm) {
  ojson messages = ojson::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": [2]}"}},
      {"id": "2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
      {"id": "3", "type": "function", "function": {"name": "h", "arguments": {"k": true}}}]},
    {"role": "user", "content": null}])");
  ojson out = normalize_chat_messages(messages);
  EXPECT_EQ(out[0]["content"], "a\nb");
  EXPECT_EQ(out[1]["content"], "");
  EXPECT_EQ(out[1]["tool_calls"][0]["function"]["arguments"].dump(), R"({"z":1,"a":[2]})");
  EXPECT_EQ(out[1]["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_EQ(out[1]["tool_calls"][2]["function"]["arguments"].dump(), R"({"k":true})");
  EXPECT_TRUE(out[2]["content"].is_null());  // only assistant content is defaulted
  EXPECT_THROW(normalize_chat_messages(ojson::object()), Error);
  EXPECT_THROW(normalize_chat_messages(ojson::parse("[1]")), Error);
}

TEST(CheckUtf8, NamesTheOffendingByte) {
  EXPECT_NO_THROW(check_utf8("h\xC3\xA9llo \xF0\x9F\x98\x80", "x"));
  try {
    check_utf8("ab\xFF", "req.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "req.json: invalid UTF-8 at byte 2");
  }
  EXPECT_THROW(check_utf8("\xED\xA0\x80", "x"), Error);  // surrogate
  EXPECT_THROW(check_utf8("\xC3", "x"), Error);          // truncated
}

}  // namespace
}  // namespace ellm
