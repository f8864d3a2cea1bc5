#pragma once
// config.json as Hugging Face writes it, for the random-weight models of `make-model` and the
// tests: Qwen3 and Qwen3-MoE flat, the Qwen3.5 generation as its vision-language wrapper with
// the text_config nested.
#include <cstdint>
#include <string>

#include "model/arch/qwen4exp.h"
#include "model/config.h"

namespace ellm {

// The config.json text for a config; the special token ids only when given (>= 0): they come
// from the tokenizer files.
std::string model_config_json(const ModelConfig& config, int32_t bos_token_id = -1,
                              int32_t eos_token_id = -1);

// Qwen3.8-Flash-Next's config.json (model_type qwen4_exp, the text config nested, no vision
// config): bos and eos are extra.eos, as in the release.
std::string qwen4exp_config_json(const ModelConfig& config, const Qwen4ExpConfig& extra);

}  // namespace ellm
