// `ellm render` through the real binary: the vector prompts byte for byte, and clear errors.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

struct Result {
  int exit_code;
  std::string out;
};

Result run(const std::string& args) {
  std::string cmd = std::string(ELLM_BIN) + " render " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  Result r{-1, ""};
  if (!pipe) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) r.out.append(buf, n);
  int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string write_temp(const std::string& name, const std::string& text) {
  fs::path p = fs::temp_directory_path() / ("ellm_render_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

const std::string kText = std::string(ELLM_SHARED) + "/text/";

TEST(RenderCli, RendersVectorCasesExactly) {
  std::ifstream in(kText + "chat_template_vectors.jsonl");
  int checked = 0;
  for (std::string line; std::getline(in, line) && checked < 12;) {
    ojson c = ojson::parse(line);
    // A request body as an OpenAI client sends it.
    ojson request = {{"model", "m"}, {"messages", c["messages"]}};
    if (!c["tools"].is_null()) request["tools"] = c["tools"];
    ojson kwargs = c["kwargs"];
    request["add_generation_prompt"] = kwargs.value("add_generation_prompt", true);
    kwargs.erase("add_generation_prompt");
    if (!kwargs.empty()) request["chat_template_kwargs"] = kwargs;
    std::string req = write_temp("req.json", request.dump());
    Result r = run("--model-path " + kText + c["template"].get<std::string>() + " --request " + req);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_EQ(r.out, c["rendered"].get<std::string>()) << c["name"];
    fs::remove(req);
    ++checked;
  }
  EXPECT_EQ(checked, 12);
}

TEST(RenderCli, ChatTemplateFlagOverridesAndGenerationPromptDefaultsOn) {
  std::string tmpl = write_temp("t.jinja", "{{ messages[0].content }}|{{ add_generation_prompt }}");
  std::string req = write_temp("req2.json", R"({"messages": [{"role": "user", "content": "x"}]})");
  Result r = run("--model-path " + kText + "qwen3 --chat-template " + tmpl + " --request " + req);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "x|True");
  fs::remove(tmpl);
  fs::remove(req);
}

TEST(RenderCli, BadInputGivesOneLineError) {
  std::string bad_utf8 = write_temp("bad.json", "{\"messages\": [{\"role\": \"user\", \"content\": \"\xC3\x28\"}]}");
  Result r = run("--model-path " + kText + "qwen3 --request " + bad_utf8);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "error: " + bad_utf8 + ": invalid UTF-8 at byte 43\n");

  std::string not_json = write_temp("notjson.json", "{\"messages\": [");
  r = run("--model-path " + kText + "qwen3 --request " + not_json);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "error: " + not_json + ": not a JSON object\n");

  std::string raising = write_temp("raise.jinja", "{{ raise_exception('only user messages') }}");
  std::string req = write_temp("req3.json", R"({"messages": []})");
  r = run("--model-path " + kText + "qwen3 --chat-template " + raising + " --request " + req);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "error: only user messages\n");

  r = run("--model-path /nonexistent --request " + req);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("error: /nonexistent: no chat template"), std::string::npos) << r.out;
  for (const std::string& f : {bad_utf8, not_json, raising, req}) fs::remove(f);
}

}  // namespace
