// Every case of shared/text/chat_template_vectors.jsonl, rendered and tokenized, gives the
// Hugging Face token ids.
#include <fstream>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "text/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace ellm {
namespace {

using ojson = nlohmann::ordered_json;

TEST(ChatTemplateIds, EveryCaseTokenizesLikeHuggingFace) {
  const std::string text_dir = std::string(ELLM_SHARED) + "/text/";
  // qwen3-coder ships no tokenizer.json; its vocabulary is qwen3's (shared/text/README.md).
  auto tokenizer = Tokenizer::load(text_dir + "qwen3");
  std::map<std::string, ChatTemplate> templates;
  for (const char* name : {"qwen3", "qwen3-coder"}) templates.emplace(name, ChatTemplate::load(text_dir + name));

  std::ifstream in(text_dir + "chat_template_vectors.jsonl");
  int cases = 0, passed = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    ojson c = ojson::parse(line);
    ojson extra = c["kwargs"];
    bool add_generation_prompt = extra.value("add_generation_prompt", false);
    extra.erase("add_generation_prompt");
    std::string prompt = templates.at(c["template"]).render(c["messages"], c["tools"], add_generation_prompt, extra);
    std::vector<int32_t> ids = tokenizer->encode(prompt);
    std::vector<int32_t> expected = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(ids, expected) << c["template"].get<std::string>() << "/" << c["name"].get<std::string>();
    ++cases;
    passed += ids == expected;
  }
  EXPECT_GT(cases, 90);
  std::printf("chat template ids: %d/%d tokenized exactly\n", passed, cases);
}

}  // namespace
}  // namespace ellm
