// ellm: one binary, one subcommand per job.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "base/error.h"
#include "cli/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* help;
};

const Command kCommands[] = {
    {"serve", ellm::cmd_serve, "OpenAI/vLLM-compatible HTTP server"},
    {"make-model", ellm::cmd_make_model, "write a random-weight model in Hugging Face layout"},
    {"generate", ellm::cmd_generate, "greedy generation from token ids"},
    {"logits", ellm::cmd_logits, "feed token chunks through one KV cache, write all logits"},
    {"tokenize", ellm::cmd_tokenize, "text on stdin -> token ids (JSON)"},
    {"detokenize", ellm::cmd_detokenize, "token ids (JSON) on stdin -> text"},
    {"render", ellm::cmd_render, "render a chat request with the model's chat template"},
    {"bench", ellm::cmd_bench, "measure the machine's limits and the engine's speed"},
};

void usage(FILE* out) {
  std::fprintf(out, "usage: ellm <command> [options]   (ellm <command> --help for its options)\n\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-12s %s\n", c.name, c.help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    try {
      return c.run(argc - 1, argv + 1);
    } catch (const ellm::Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "error: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
