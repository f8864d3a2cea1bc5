// ellm render: an OpenAI chat request -> the exact prompt text the model sees.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/commands.h"
#include "text/chat_template.h"

namespace ellm {

int cmd_render(int argc, char** argv) {
  CLI::App app{"Render a chat request (OpenAI JSON body) with the model's chat template"};
  std::string model_path, chat_template, request_path;
  app.add_option("--model-path", model_path, "Hugging Face model folder")->required();
  app.add_option("--chat-template", chat_template, "Jinja template file overriding the model's");
  app.add_option("--request", request_path, "JSON request: messages, tools, add_generation_prompt, chat_template_kwargs")
      ->required();
  CLI11_PARSE(app, argc, argv);

  std::ifstream in(request_path, std::ios::binary);
  if (!in) throw Error(request_path + ": cannot read file");
  std::ostringstream text;
  text << in.rdbuf();
  check_utf8(text.str(), request_path);
  nlohmann::ordered_json request = nlohmann::ordered_json::parse(text.str(), nullptr, false);
  if (request.is_discarded() || !request.is_object()) throw Error(request_path + ": not a JSON object");
  if (!request.contains("messages")) throw Error(request_path + ": missing field 'messages'");

  nlohmann::ordered_json tools = request.value("tools", nlohmann::ordered_json());
  auto generation_prompt = request.find("add_generation_prompt");
  bool add_generation_prompt = true;
  if (generation_prompt != request.end()) {
    if (!generation_prompt->is_boolean()) throw Error(request_path + ": 'add_generation_prompt' must be a boolean");
    add_generation_prompt = generation_prompt->get<bool>();
  }
  nlohmann::ordered_json kwargs = request.value("chat_template_kwargs", nlohmann::ordered_json::object());
  if (kwargs.is_null()) kwargs = nlohmann::ordered_json::object();
  if (!kwargs.is_object()) throw Error(request_path + ": 'chat_template_kwargs' must be an object");

  ChatTemplate tmpl = ChatTemplate::load(model_path, chat_template);
  std::string prompt = tmpl.render(request["messages"], tools, add_generation_prompt, kwargs);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace ellm
