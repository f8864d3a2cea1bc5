#pragma once
// generation_config.json: the stop ids and the sampling defaults a model ships with.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace ellm {

struct GenerationDefaults {
  std::vector<int32_t> eos_token_ids;
  SamplingParams sampling;
};

// Reads <model_dir>/generation_config.json; without it, eos_token_id of config.json and neutral
// sampling. Throws Error naming the file on a malformed one.
GenerationDefaults load_generation_defaults(const std::string& model_dir);

}  // namespace ellm
