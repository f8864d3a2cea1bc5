#pragma once
// RoPE frequencies and their scaling. The config's rope type (rope_scaling for Qwen3,
// rope_parameters for Qwen3.5+) is "default" (mRoPE with text positions is plain RoPE) or
// "yarn"; YaRN follows transformers' _compute_yarn_parameters and is static over the sequence:
// the same frequencies and attention factor at every position, as in transformers, vLLM and
// llama.cpp.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace ellm {

// Reads the rope type of a rope_scaling / rope_parameters object (named `key` in errors) and,
// for YaRN, its factor, original_max_position_embeddings, beta_fast, beta_slow,
// attention_factor (or mscale / mscale_all_dim) and truncate into c.rope_scaling. Call after
// max_position_embeddings is read. Another rope type is a one-line error.
void parse_rope_type(const nlohmann::json& object, const std::string& where, const char* key, ModelConfig& c);

// "yarn:FACTOR[:ORIGINAL]" (--rope-scaling) as a RopeScaling (original 0: the config's
// max_position_embeddings); "none" or "default": no scaling. Throws a one-line error.
RopeScaling parse_rope_scaling_flag(const std::string& spec, const std::string& where);
// Puts a flag's scaling on a config (a type "default" leaves the config's own).
void apply_rope_scaling(ModelConfig& c, const RopeScaling& flag);

// YaRN's correction range: the dims [low, high] between which the frequencies ramp from
// extrapolated (kept) to interpolated (divided by the factor), for `dim` rotary dims.
std::pair<double, double> yarn_correction_range(const RopeScaling& s, int64_t dim, double theta);

// The inverse frequencies of the rotary dims ([rotary_dim / 2], FP32 as transformers forms them)
// and the factor that multiplies every cos and sin.
struct RopeTable {
  std::vector<float> inv_freq;
  float attention_factor = 1.0f;
};
RopeTable rope_table(const ModelConfig& c);
// "rope_theta=... [yarn=factor,original,beta_fast,beta_slow,attention_factor,truncate]": what
// the KV format names, so KV rotated one way is never read as the other (and the load line).
std::string rope_format(const ModelConfig& c);

}  // namespace ellm
