// Every case of shared/text/chat_template_vectors.jsonl (Qwen3, Qwen3-Coder) and of
// shared/text/qwen35/chat_template_vectors.jsonl (Qwen3.6, Qwen3.8) renders exactly to
// `rendered` (the Hugging Face output) with the template the case names.
#include <fstream>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "text/chat_template.h"

namespace ellm {
namespace {

using ojson = nlohmann::ordered_json;

std::vector<ojson> load_vectors(const std::string& file = "chat_template_vectors.jsonl") {
  std::ifstream in(std::string(ELLM_SHARED) + "/text/" + file);
  std::vector<ojson> cases;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) cases.push_back(ojson::parse(line));
  return cases;
}

// "qwen3", "qwen3-coder": the folder of that name; "qwen3.6", "qwen3.8": the official template
// files in qwen35/.
const ChatTemplate& template_named(const std::string& name) {
  static std::map<std::string, ChatTemplate> cache;
  const std::string text = std::string(ELLM_SHARED) + "/text/";
  auto it = cache.find(name);
  if (it == cache.end()) {
    if (name == "qwen3.6" || name == "qwen3.8")
      it = cache.emplace(name, ChatTemplate::load(text + "qwen35", text + "qwen35/" +
                                                      (name == "qwen3.6" ? "chat_template.jinja" : "chat_template_qwen38.jinja"))).first;
    else
      it = cache.emplace(name, ChatTemplate::load(text + name)).first;
  }
  return it->second;
}

// kwargs = {add_generation_prompt, ...template switches}
std::string render_case(const ojson& c) {
  ojson extra = c["kwargs"];
  bool add_generation_prompt = extra.value("add_generation_prompt", false);
  extra.erase("add_generation_prompt");
  return template_named(c["template"]).render(c["messages"], c["tools"], add_generation_prompt, extra);
}

void expect_every_case_renders(const std::vector<ojson>& cases) {
  int passed = 0;
  for (const ojson& c : cases) {
    std::string label = c["template"].get<std::string>() + "/" + c["name"].get<std::string>();
    std::string rendered;
    EXPECT_NO_THROW(rendered = render_case(c)) << label;
    EXPECT_EQ(rendered, c["rendered"].get<std::string>()) << label;
    passed += rendered == c["rendered"].get<std::string>();
  }
  std::printf("chat template vectors: %d/%zu rendered exactly\n", passed, cases.size());
}

TEST(ChatTemplateVectors, EveryCaseRendersLikeHuggingFace) {
  std::vector<ojson> cases = load_vectors();
  ASSERT_GT(cases.size(), 90u);
  expect_every_case_renders(cases);
}

// Qwen3.6 (preserve_thinking off by default) and Qwen3.8 (on by default, reasoning_effort):
// XML tool calls, tool results in user turns, the reply opening with <think>\n.
TEST(ChatTemplateVectors, Qwen36AndQwen38CasesRenderLikeHuggingFace) {
  std::vector<ojson> cases = load_vectors("qwen35/chat_template_vectors.jsonl");
  ASSERT_GT(cases.size(), 200u);
  expect_every_case_renders(cases);
}

TEST(ChatTemplateVectors, BothTemplatesLoadFromTheirFolders) {
  for (const char* name : {"qwen3", "qwen3-coder"}) {
    ChatTemplate t = ChatTemplate::load(std::string(ELLM_SHARED) + "/text/" + name);
    EXPECT_NE(t.source().find("<|im_start|>"), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace ellm
