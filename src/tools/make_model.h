#pragma once
// Random-weight models in Hugging Face layout, for tests, benchmarks and the default model.
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/load/safetensors.h"

namespace ellm {

struct VisionConfig;

// The presets of Qwen3 and the Qwen3.5 generation (make_qwen4exp.h has Qwen3.8-Flash-Next's).
std::vector<std::string> preset_names();
ModelConfig preset_config(const std::string& name);  // throws Error listing the presets
// The folder under shared/text/ whose tokenizer a preset uses by default: qwen35 for
// qwen3.8-flash-next (vocabulary 248,320; Qwen3.8's template), else qwen3.
std::string preset_tokenizer(const std::string& preset);

// Every tensor a checkpoint of this config holds, with its Hugging Face name and shape. A
// Qwen3.5 MoE's routed experts are one tensor each, or with fused_experts two 3-D tensors per
// layer (experts.gate_up_proj, experts.down_proj), as its BF16 checkpoints store them.
std::vector<TensorSpec> checkpoint_tensors(const ModelConfig& config, bool fused_experts = false);

struct MakeModelOptions {
  std::string preset;
  int64_t layers = 0;  // 0 = the preset's depth
  uint64_t seed = 0;
  int shards = 1;
  std::string out_dir;
  std::string tokenizer_dir;  // holds tokenizer.json, tokenizer_config.json, chat_template.jinja
  std::string dtype = "bf16";  // "fp8": decoder linear weights as Qwen's FP8 checkpoints; "gptq",
                               // "awq": as 4-bit modules (int4_checkpoint.h)
  bool fused_experts = false;  // Qwen3.5 MoE: experts.gate_up_proj / down_proj (BF16 only)
  bool vision = true;  // the Qwen3.5-generation presets' vision tower (vision_checkpoint.h)
};

// Writes config.json, generation_config.json, the weights (streamed) and the tokenizer files.
void make_model(const MakeModelOptions& options);

// The special tokens a model folder's config.json and generation_config.json name, as the
// tokenizer files define them (-1: unknown).
struct SpecialTokenIds {
  int32_t endoftext = -1;  // <|endoftext|>: bos, pad and the second eos
  int32_t im_end = -1;     // <|im_end|>: the end of a chat turn, the first eos
  int32_t image_pad = -1, video_pad = -1, vision_start = -1, vision_end = -1;  // the image tokens
};

// From <tokenizer_dir>/tokenizer.json added_tokens. Throws Error naming the file.
SpecialTokenIds read_special_token_ids(const std::string& tokenizer_dir);

// Writes config.json, generation_config.json and random weights for any config (tests use
// shapes no preset has). Without known special tokens, the files name none. With dtype fp8, the
// decoder layers' linear weights are F8_E4M3 with F32 factors per 128x128 block (the BF16
// model of the same seed, quantised as `--quantize fp8` does); with gptq or awq they are 4-bit
// modules (the BF16 model of the same seed rounded to nearest on that format's grid, groups of
// 128 or fewer inputs); "gptq-as-bf16" and "awq-as-bf16" write those models' weights as BF16
// values. With a `vision` tower (a Qwen3.5-generation config), config.json gets its
// vision_config, the checkpoint its model.visual.* tensors (BF16 whatever the dtype), and the
// folder a preprocessor_config.json.
void write_random_model(ModelConfig config, const std::string& out_dir, uint64_t seed, int shards,
                        const SpecialTokenIds& special = {}, const std::string& dtype = "bf16",
                        bool fused_experts = false, const VisionConfig* vision = nullptr);

}  // namespace ellm
