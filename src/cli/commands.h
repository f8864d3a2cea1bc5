#pragma once
// Subcommands of the single `ellm` binary. Each takes the arguments after its name
// (argv[0] is the subcommand) and returns the process exit code; errors are thrown as
// ellm::Error and reported by main().

#include "kernels/kv_dtype.h"

namespace CLI {
class App;
}

namespace ellm {

enum class ActivationDtype;  // model/model.h
struct RopeScaling;          // model/config.h

// --quantize none|fp8|int4 (serve, bench, logits, generate; cmd_model.cc): BF16 linear weights
// to FP8 or INT4 at load. quantize_fp8_requested(app) after parsing: whether fp8 was asked for.
void add_quantize_option(CLI::App& app);
void add_mlock_table_option(CLI::App& app);
bool mlock_table_requested(const CLI::App& app);
bool quantize_fp8_requested(const CLI::App& app);
bool quantize_int4_requested(const CLI::App& app);
// --activations auto|bf16|int8 (serve, logits, generate; cmd_model.cc): the inputs of INT4
// products (model.h Activations); activations_requested(app) after parsing.
void add_activations_option(CLI::App& app);
ActivationDtype activations_requested(const CLI::App& app);
// --rope-scaling yarn:FACTOR[:ORIGINAL] (serve, bench, logits, generate; cmd_model.cc): YaRN for a
// folder whose config does not carry it; rope_scaling_requested(app) after parsing.
void add_rope_scaling_option(CLI::App& app);
RopeScaling rope_scaling_requested(const CLI::App& app);

// --kv-cache-dtype fp16|bf16|fp8 (serve, bench, logits, generate; kv_dtype_option.cc): the KV
// cache's element type (ServingLimits::kv_dtype); kv_cache_dtype_requested(app) after parsing.
// With it, --attention-products fp32|bf16 (ServingLimits::attention_bf16_products):
// attention_bf16_requested(app).
void add_kv_cache_dtype_option(CLI::App& app);
KvDtype kv_cache_dtype_requested(const CLI::App& app);
bool attention_bf16_requested(const CLI::App& app);

int cmd_make_model(int argc, char** argv);  // cmd_model.cc
int cmd_logits(int argc, char** argv);      // cmd_model.cc
int cmd_generate(int argc, char** argv);    // cmd_model.cc
int cmd_tokenize(int argc, char** argv);    // cmd_text.cc
int cmd_detokenize(int argc, char** argv);  // cmd_text.cc
int cmd_render(int argc, char** argv);      // cmd_render.cc
int cmd_serve(int argc, char** argv);       // cmd_serve.cc
int cmd_bench(int argc, char** argv);       // cmd_bench.cc

}  // namespace ellm
