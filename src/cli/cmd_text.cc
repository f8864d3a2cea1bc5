// ellm tokenize / detokenize: the model folder's tokenizer on stdin/stdout.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/commands.h"
#include "text/tokenizer/tokenizer.h"

namespace ellm {
namespace {

std::string read_all(std::istream& in) { return {std::istreambuf_iterator<char>(in), {}}; }

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  CLI::App app("Text (stdin or --text-file) -> token ids as a JSON array", "ellm tokenize");
  std::string model_path, text_file;
  app.add_option("--model-path", model_path, "model folder with tokenizer.json")->required();
  app.add_option("--text-file", text_file, "read the text from this file instead of stdin");
  CLI11_PARSE(app, argc, argv);

  auto tokenizer = Tokenizer::load(model_path);
  std::string text;
  if (text_file.empty()) {
    text = read_all(std::cin);
  } else {
    std::ifstream in(text_file, std::ios::binary);
    if (!in) fail(text_file, "cannot open file");
    text = read_all(in);
  }
  std::cout << nlohmann::json(tokenizer->encode(text)).dump() << "\n";
  return 0;
}

int cmd_detokenize(int argc, char** argv) {
  CLI::App app("Token ids (JSON array on stdin) -> exactly the decoded text on stdout", "ellm detokenize");
  std::string model_path;
  bool skip_special_tokens = false;
  app.add_option("--model-path", model_path, "model folder with tokenizer.json")->required();
  app.add_flag("--skip-special-tokens", skip_special_tokens, "drop added tokens flagged special");
  CLI11_PARSE(app, argc, argv);

  nlohmann::json input = nlohmann::json::parse(read_all(std::cin), nullptr, /*allow_exceptions=*/false);
  if (!input.is_array()) fail("stdin", "expected a JSON array of token ids");
  std::vector<int32_t> ids;
  for (const auto& id : input) {
    if (!id.is_number_integer() || id.get<int64_t>() < INT32_MIN || id.get<int64_t>() > INT32_MAX)
      fail("stdin", "token ids must be integers, got " + id.dump());
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  std::string text = Tokenizer::load(model_path)->decode(ids, skip_special_tokens);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace ellm
