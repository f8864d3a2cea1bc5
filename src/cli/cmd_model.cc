// make-model, logits, generate: the model layer from the command line.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/log.h"
#include "cli/cli_images.h"
#include "cli/commands.h"
#include "model/config.h"
#include "tools/make_model.h"
#include "tools/make_qwen4exp.h"
#include "model/model.h"
#include "model/rope.h"

namespace ellm {
namespace {

namespace fs = std::filesystem;

// Parses argv with CLI11; returns the exit code to stop with (help or a usage error), or -1.
int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return -1;
}

std::string exe_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "." : exe.parent_path().string();
}

// The tokenizer files of shared/text/<name> (qwen3 unless a preset asks for another):
// $ELLM_SHARED/text/<name>, else the shared folder beside the repository the binary was built in.
std::string default_tokenizer_dir(const std::string& name) {
  std::vector<std::string> candidates;
  if (const char* shared = std::getenv("ELLM_SHARED")) candidates.push_back(std::string(shared) + "/text/" + name);
  for (const char* up : {"/../../shared/text/", "/../shared/text/", "/../../../shared/text/"})
    candidates.push_back(exe_dir() + up + name);
  for (const std::string& dir : candidates)
    if (fs::exists(dir + "/tokenizer.json")) return fs::weakly_canonical(dir).string();
  fail("--tokenizer-from", "no tokenizer found (looked in $ELLM_SHARED/text/" + name + " and beside "
                           "the build); pass --tokenizer-from DIR");
}

// FEEDS.json: [[ids...], ...] or {"feeds": [[ids...], ...], ...} (a golden session.json).
std::vector<std::vector<int32_t>> read_feeds(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, "cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    fail(path, "invalid JSON");
  }
  if (j.is_object() && j.contains("feeds")) j = j["feeds"];
  if (!j.is_array()) fail(path, "expected a JSON array of arrays of token ids");
  std::vector<std::vector<int32_t>> feeds;
  for (const auto& chunk : j) {
    if (!chunk.is_array() || chunk.empty())
      fail(path, "each feed must be a non-empty array of token ids");
    auto& ids = feeds.emplace_back();
    for (const auto& id : chunk) {
      if (!id.is_number_integer() || id.get<int64_t>() < INT32_MIN || id.get<int64_t>() > INT32_MAX)
        fail(path, "token ids must be integers");
      ids.push_back(id.get<int32_t>());
    }
  }
  if (feeds.empty()) fail(path, "no feeds");
  return feeds;
}

// Checks ids against the vocabulary and the total against the sequence length before the
// (slow) weight load, so the message names the input.
void check_tokens(const std::string& where, const std::vector<int32_t>& ids, int64_t vocab,
                  int64_t sequence_length) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      fail(where, "token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                      " is outside the vocabulary (" + std::to_string(vocab) + " ids)");
  if (int64_t(ids.size()) > sequence_length)
    fail(where, std::to_string(ids.size()) + " tokens exceed --sequence-length " +
                    std::to_string(sequence_length));
}

void feed(Model& model, const std::vector<int32_t>& ids, int64_t start, bool all_logits,
          std::vector<BatchToken>& batch, float* logits, const CliImages* images = nullptr) {
  batch.clear();
  for (size_t i = 0; i < ids.size(); ++i) {
    batch.push_back({ids[i], 0, int32_t(start + int64_t(i)), all_logits || i + 1 == ids.size()});
    if (images) images->apply(batch.back());
  }
  model.forward(batch, logits);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

void add_quantize_option(CLI::App& app) {
  app.add_option("--quantize", "weights: none (as stored), fp8 (BF16 linear weights converted "
                               "to FP8 E4M3 per 128x128 block at load) or int4 (BF16 or FP8 "
                               "linear weights to 4 bits per group of 128 inputs at load)")
      ->check(CLI::IsMember({"none", "fp8", "int4"}))
      ->default_str("none");
}

void add_mlock_table_option(CLI::App& app) {
  app.add_flag("--mlock-table")
      ->description("pin the n-gram table of Qwen3.8-Flash-Next in RAM (mlock: read whole at load; needs the "
                    "RAM and a locked-memory limit that allows it)");
}

bool mlock_table_requested(const CLI::App& app) { return app.get_option("--mlock-table")->count() > 0; }

namespace {

bool quantize_requested(const CLI::App& app, const char* kind) {
  const CLI::Option* option = app.get_option("--quantize");
  return option->count() > 0 && option->as<std::string>() == kind;
}

}  // namespace

bool quantize_fp8_requested(const CLI::App& app) { return quantize_requested(app, "fp8"); }
bool quantize_int4_requested(const CLI::App& app) { return quantize_requested(app, "int4"); }

void add_activations_option(CLI::App& app) {
  app.add_option("--activations", "inputs of INT4 products: bf16 (the reference's numeric path), "
                                  "int8 (quantised per 32 inputs, vpdpbusd) or auto (int8 where "
                                  "the CPU has VNNI; on AVX2 without it the faster of the two, "
                                  "timed at load)")
      ->check(CLI::IsMember({"auto", "bf16", "int8"}))
      ->default_str("auto");
}

ActivationDtype activations_requested(const CLI::App& app) {
  const CLI::Option* option = app.get_option("--activations");
  if (option->count() == 0) return ActivationDtype::automatic;
  const std::string value = option->as<std::string>();
  return value == "bf16" ? ActivationDtype::bf16 : value == "int8" ? ActivationDtype::int8 : ActivationDtype::automatic;
}

void add_rope_scaling_option(CLI::App& app) {
  app.add_option("--rope-scaling", "YaRN over the model's RoPE: yarn:FACTOR[:ORIGINAL], ORIGINAL the "
                                   "pre-YaRN window (default: the config's max_position_embeddings), "
                                   "e.g. yarn:4 for 1M positions of Qwen3.5+, yarn:4:32768 for 131k of "
                                   "Qwen3; none: as the config says");
}

RopeScaling rope_scaling_requested(const CLI::App& app) {
  const CLI::Option* option = app.get_option("--rope-scaling");
  if (option->count() == 0) return {};
  return parse_rope_scaling_flag(option->as<std::string>(), "--rope-scaling");
}

int cmd_make_model(int argc, char** argv) {
  CLI::App app{"Write a random-weight Qwen3, Qwen3.5 or Qwen3.8-Flash-Next model in Hugging Face layout",
               "make-model"};
  MakeModelOptions o;
  std::string presets;
  for (const std::string& n : preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  for (const std::string& n : qwen4exp_preset_names()) presets += ", " + n;
  app.add_option("--preset", o.preset, "model shape: " + presets)->required();
  app.add_option("--layers", o.layers, "number of layers (default: the preset's)");
  app.add_option("--seed", o.seed, "random seed");
  app.add_option("--shards", o.shards, "split the weights over this many safetensors files");
  app.add_option("--dtype", o.dtype, "bf16; fp8: decoder linear weights as F8_E4M3 with a "
                                     "factor per 128x128 block, as Qwen's FP8 checkpoints (and "
                                     "Qwen3.8-Flash-Next's n-gram table as E4M3 with one scale); "
                                     "gptq, awq: as 4-bit modules in those layouts")
      ->check(CLI::IsMember({"bf16", "fp8", "gptq", "awq"}));
  app.add_flag("--fused-experts", o.fused_experts,
               "Qwen3.5 MoE presets: each layer's experts as two 3-D tensors (experts.gate_up_proj, "
               "experts.down_proj), as the BF16 checkpoints store them; default one tensor per expert");
  bool no_vision = false;
  app.add_flag("--no-vision", no_vision,
               "Qwen3.5 / Qwen3.6 presets: leave out the vision tower (model.visual.*, "
               "vision_config, preprocessor_config.json), as a text-only folder");
  app.add_option("--out", o.out_dir, "output folder")->required();
  app.add_option("--tokenizer-from", o.tokenizer_dir,
                 "folder with tokenizer.json, tokenizer_config.json, chat_template.jinja "
                 "(default: $ELLM_SHARED/text/qwen3)");
  if (int code = parse(app, argc, argv); code >= 0) return code;
  o.vision = !no_vision;
  if (o.tokenizer_dir.empty()) o.tokenizer_dir = default_tokenizer_dir(preset_tokenizer(o.preset));
  make_model(o);
  log_info("wrote " + o.out_dir);
  return 0;
}

int cmd_logits(int argc, char** argv) {
  CLI::App app{"Feed token chunks through one KV cache and write every position's logits",
               "logits"};
  std::string model_dir, feeds_path, out_path, images_path;
  ServingLimits limits;
  limits.sequence_length = 0;
  app.add_option("--model-path", model_dir, "Hugging Face model folder")->required();
  app.add_option("--feeds", feeds_path, "JSON array of arrays of token ids")->required();
  app.add_option("--out", out_path, "output: float32 [positions][vocab]")->required();
  app.add_option("--images", images_path,
                 "JSON list of {\"file\", \"first_token_index\"} (files relative to it): each image's tower rows "
                 "at its <|image_pad|> run, with the 3-D positions that follow");
  app.add_option("--sequence-length", limits.sequence_length,
                 "KV cache positions (default: the total fed)");
  app.add_option("--threads", limits.threads, "worker threads (default: one per core)");
  add_quantize_option(app);
  add_activations_option(app);
  add_rope_scaling_option(app);
  add_kv_cache_dtype_option(app);
  if (int code = parse(app, argc, argv); code >= 0) return code;
  limits.rope_scaling = rope_scaling_requested(app);
  limits.kv_dtype = kv_cache_dtype_requested(app);
  limits.attention_bf16_products = attention_bf16_requested(app);
  limits.quantize_fp8 = quantize_fp8_requested(app);
  limits.quantize_int4 = quantize_int4_requested(app);
  limits.activations = activations_requested(app);

  std::vector<std::vector<int32_t>> feeds = read_feeds(feeds_path);
  std::vector<int32_t> all;
  size_t longest = 0;
  for (const auto& f : feeds) {
    all.insert(all.end(), f.begin(), f.end());
    longest = std::max(longest, f.size());
  }
  ModelConfig config = load_model_config(model_dir);
  if (limits.sequence_length == 0) limits.sequence_length = int64_t(all.size());
  check_tokens(feeds_path, all, config.vocab_size, limits.sequence_length);
  limits.chunk_size = int64_t(longest);
  std::unique_ptr<Model> model = Model::load(model_dir, limits);
  CliImages images;
  if (!images_path.empty()) images = load_cli_images(images_path, *model, model_dir);

  std::FILE* out = std::fopen(out_path.c_str(), "wb");
  if (!out) fail(out_path, "cannot create");
  const int64_t V = model->vocab_size();
  std::vector<float> logits(longest * size_t(V));
  std::vector<BatchToken> batch;
  int64_t position = 0;
  auto start = std::chrono::steady_clock::now();
  for (const auto& ids : feeds) {
    feed(*model, ids, position, true, batch, logits.data(), &images);
    position += int64_t(ids.size());
    size_t count = ids.size() * size_t(V);
    if (std::fwrite(logits.data(), sizeof(float), count, out) != count) {
      std::fclose(out);
      fail(out_path, "write failed");
    }
  }
  if (std::fclose(out) != 0) fail(out_path, "write failed");
  char line[160];
  std::snprintf(line, sizeof line, "%lld positions in %zu feeds, %.3f s", (long long)position,
                feeds.size(), seconds_since(start));
  log_info(line);
  return 0;
}

int cmd_generate(int argc, char** argv) {
  CLI::App app{"Greedy generation from token ids (prints the generated ids)", "generate"};
  std::string model_dir, prompt_text;
  int64_t max_tokens = 16;
  ServingLimits limits;
  limits.sequence_length = 0;
  app.add_option("--model-path", model_dir, "Hugging Face model folder")->required();
  app.add_option("--prompt-ids", prompt_text, "comma-separated token ids, e.g. 1,2,3")->required();
  app.add_option("--max-tokens", max_tokens, "tokens to generate");
  app.add_option("--sequence-length", limits.sequence_length,
                 "KV cache positions (default: prompt + max tokens)");
  app.add_option("--threads", limits.threads, "worker threads (default: one per core)");
  add_quantize_option(app);
  add_activations_option(app);
  add_rope_scaling_option(app);
  add_kv_cache_dtype_option(app);
  if (int code = parse(app, argc, argv); code >= 0) return code;
  limits.rope_scaling = rope_scaling_requested(app);
  limits.kv_dtype = kv_cache_dtype_requested(app);
  limits.attention_bf16_products = attention_bf16_requested(app);
  limits.quantize_fp8 = quantize_fp8_requested(app);
  limits.quantize_int4 = quantize_int4_requested(app);
  limits.activations = activations_requested(app);

  std::vector<int32_t> prompt;
  std::stringstream ss(prompt_text);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < INT32_MIN || v > INT32_MAX)
      fail("--prompt-ids", "'" + item + "' is not a token id");
    prompt.push_back(int32_t(v));
  }
  if (prompt.empty()) fail("--prompt-ids", "empty prompt");
  if (max_tokens < 0) fail("--max-tokens", "must not be negative");
  ModelConfig config = load_model_config(model_dir);
  if (limits.sequence_length == 0) limits.sequence_length = int64_t(prompt.size()) + max_tokens;
  check_tokens("--prompt-ids", prompt, config.vocab_size, limits.sequence_length);
  if (int64_t(prompt.size()) + max_tokens > limits.sequence_length)
    fail("--max-tokens", "prompt + max tokens exceed --sequence-length " +
                             std::to_string(limits.sequence_length));
  limits.chunk_size = int64_t(prompt.size());
  std::unique_ptr<Model> model = Model::load(model_dir, limits);

  const int64_t V = model->vocab_size();
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<BatchToken> batch;
  std::vector<int32_t> out;
  auto start = std::chrono::steady_clock::now();
  double prefill_seconds = 0;
  std::vector<int32_t> next = prompt;
  int64_t position = 0;
  for (int64_t i = 0; i < max_tokens; ++i) {
    feed(*model, next, position, false, batch, logits.data());
    position += int64_t(next.size());
    if (i == 0) prefill_seconds = seconds_since(start);
    int32_t best = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(best);
    next = {best};
  }
  double total = seconds_since(start);
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
  std::printf("\n");
  char line[200];
  std::snprintf(line, sizeof line, "prefill %zu tokens %.1f tok/s, decode %lld tokens %.1f tok/s",
                prompt.size(), prompt.size() / std::max(prefill_seconds, 1e-9),
                (long long)std::max<int64_t>(max_tokens - 1, 0),
                std::max<int64_t>(max_tokens - 1, 0) / std::max(total - prefill_seconds, 1e-9));
  log_info(line);
  return 0;
}

}  // namespace ellm
