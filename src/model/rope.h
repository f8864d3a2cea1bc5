#pragma once
// RoPE frequencies and their scaling. The config's rope type (rope_scaling for Qwen3,
// rope_parameters for Qwen3.5+) is "default" (mRoPE with text positions is plain RoPE) or
// "yarn"; YaRN follows transformers' _compute_yarn_parameters and is static over the sequence:
// the same frequencies and attention factor at every position, as in transformers, vLLM and
// llama.cpp.
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/model.h"

namespace ellm {

// Reads the rope type of a rope_scaling / rope_parameters object (named `key` in errors) and,
// for YaRN, its factor, original_max_position_embeddings, beta_fast, beta_slow,
// attention_factor (or mscale / mscale_all_dim) and truncate into c.rope_scaling. Call after
// max_position_embeddings is read. Another rope type is a one-line error.
void parse_rope_type(const nlohmann::json& object, const std::string& where, const char* key, ModelConfig& c);
// A rope_parameters object's mrope_section (three counts of frequencies: T, H, W) and
// mrope_interleaved; check_mrope: once the rotary dims are known, the counts cover them.
void parse_mrope(const nlohmann::json& rope, const std::string& where, ModelConfig& c);
void check_mrope(const std::string& where, const ModelConfig& c);

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
  // Multimodal RoPE: per frequency, the position it turns with (0 T, 1 H, 2 W); empty: none.
  std::vector<uint8_t> axis;
};
RopeTable rope_table(const ModelConfig& c);
// "rope_theta=... [yarn=factor,original,beta_fast,beta_slow,attention_factor,truncate]": what
// the KV format names, so KV rotated one way is never read as the other (and the load line).
std::string rope_format(const ModelConfig& c);

// A token's cos and sin over the rotary frequencies: at its (T, H, W) rope position where it has
// one (BatchToken::rope) and the model has multimodal RoPE, else at its position.
void token_rope_angles(const BatchToken& t, const RopeTable& table, float* cos, float* sin);

// Where an image sits in a sequence: its <|image_pad|> run starts at token `first` and holds
// merged_h * merged_w tokens, row-major over the merged patch grid.
struct ImagePlacement {
  int64_t first, merged_h, merged_w;
  int64_t end() const { return first + merged_h * merged_w; }
};
// The (T, H, W) rope position of token `index` of a sequence holding `images` (in order, not
// overlapping), as transformers' get_rope_index gives it for the whole sequence: text positions
// run on by one; an image whose first pad would sit at s gives its token (row, col) the position
// (s, s + row, s + col), and the token after it s + max(merged_h, merged_w).
std::array<int32_t, 3> rope_position(std::span<const ImagePlacement> images, int64_t index);
// Sets t.rope from rope_position where it differs from the text position (after an image).
void set_rope_position(BatchToken& t, std::span<const ImagePlacement> images);

}  // namespace ellm
