// Every case of shared/text/chat_template_vectors.jsonl renders exactly to `rendered`
// (the Hugging Face output) with the template the case names.
#include <fstream>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "text/chat_template.h"

namespace ellm {
namespace {

using ojson = nlohmann::ordered_json;

std::vector<ojson> load_vectors() {
  std::ifstream in(std::string(ELLM_SHARED) + "/text/chat_template_vectors.jsonl");
  std::vector<ojson> cases;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) cases.push_back(ojson::parse(line));
  return cases;
}

const ChatTemplate& template_named(const std::string& name) {
  static std::map<std::string, ChatTemplate> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, ChatTemplate::load(std::string(ELLM_SHARED) + "/text/" + name)).first;
  return it->second;
}

// kwargs = {add_generation_prompt, ...template switches}
std::string render_case(const ojson& c) {
  ojson extra = c["kwargs"];
  bool add_generation_prompt = extra.value("add_generation_prompt", false);
  extra.erase("add_generation_prompt");
  return template_named(c["template"]).render(c["messages"], c["tools"], add_generation_prompt, extra);
}

TEST(ChatTemplateVectors, EveryCaseRendersLikeHuggingFace) {
  std::vector<ojson> cases = load_vectors();
  ASSERT_GT(cases.size(), 90u);
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

TEST(ChatTemplateVectors, BothTemplatesLoadFromTheirFolders) {
  for (const char* name : {"qwen3", "qwen3-coder"}) {
    ChatTemplate t = ChatTemplate::load(std::string(ELLM_SHARED) + "/text/" + name);
    EXPECT_NE(t.source().find("<|im_start|>"), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace ellm
