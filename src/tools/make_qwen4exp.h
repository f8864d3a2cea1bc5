#pragma once
// make-model for Qwen3.8-Flash-Next (model_type qwen4_exp; docs/models/qwen4exp.md): its config
// and checkpoint, random weights in the layout of the release, BF16 or FP8.
//   - BF16: every tensor BF16, each layer's experts fused (experts.gate_up_proj, down_proj).
//   - FP8: the matrices (but the router, the shared expert's gate and the GDN's in_proj_a/b) as
//     F8_E4M3 with a BF16 weight_scale_inv per 128x128 block, the experts one by one, as Qwen's
//     other FP8 checkpoints; the n-gram table's shards F8_E4M3 with one F32 scalar for the whole
//     table (ple.ple_embedding.ngram_embedding.weight_scale). The values are the BF16 model's of
//     the same seed, quantised.
//   - The n-gram table: random rows when it is small (at most kLargestWrittenTable bytes), else
//     holes of sparse files (zero rows that take no disk), so the real preset has its
//     320,001,536-row table at no cost.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/arch/qwen4exp.h"
#include "model/config.h"
#include "model/load/safetensors.h"
#include "model/vision/vision_config.h"

namespace ellm {

struct SpecialTokenIds;

struct Qwen4ExpShape {
  ModelConfig config;
  Qwen4ExpConfig extra;
  std::optional<VisionConfig> vision;  // model.visual.*, BF16 whatever the dtype; none: text only
};

// tiny-qwen4exp (the shape of the shared tiny model) and qwen3.8-flash-next (the release's),
// each with its vision tower.
std::vector<std::string> qwen4exp_preset_names();
bool is_qwen4exp_preset(const std::string& name);
Qwen4ExpShape qwen4exp_preset(const std::string& name);

// Cuts (or extends) the model to `layers`: layer_types follow the pattern (every fourth layer
// QSA) and the n-gram module stays at its layer, or at the last layer when the cut leaves it out.
void set_qwen4exp_layers(Qwen4ExpShape& shape, int64_t layers);

constexpr uint64_t kLargestWrittenTable = 64ull << 20;

// The E4M3 table's one scale: the largest magnitude of its rows' random values over 448.
float qwen4exp_table_scale();

// Every tensor of the checkpoint (fp8: the FP8 one's, factors and table scale included).
std::vector<TensorSpec> qwen4exp_tensors(const Qwen4ExpShape& shape, bool fp8);

// Writes config.json, generation_config.json and the weights (dtype bf16 or fp8); with a tower
// (and a tokenizer that names <|image_pad|>) also its tensors, vision_config and
// preprocessor_config.json.
void write_random_qwen4exp(Qwen4ExpShape shape, const std::string& out_dir, uint64_t seed, int shards,
                           const SpecialTokenIds& special, const std::string& dtype);

}  // namespace ellm
