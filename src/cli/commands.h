#pragma once
// Subcommands of the single `ellm` binary. Each takes the arguments after its name
// (argv[0] is the subcommand) and returns the process exit code; errors are thrown as
// ellm::Error and reported by main().

namespace ellm {

int cmd_make_model(int argc, char** argv);  // cmd_model.cc
int cmd_logits(int argc, char** argv);      // cmd_model.cc
int cmd_generate(int argc, char** argv);    // cmd_model.cc
int cmd_tokenize(int argc, char** argv);    // cmd_text.cc
int cmd_detokenize(int argc, char** argv);  // cmd_text.cc
int cmd_render(int argc, char** argv);      // cmd_render.cc
int cmd_serve(int argc, char** argv);       // cmd_serve.cc
int cmd_bench(int argc, char** argv);       // cmd_bench.cc

}  // namespace ellm
