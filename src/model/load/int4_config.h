#pragma once
// quantization_config of GPTQ and AWQ 4-bit checkpoints (the formats: shared/golden/README.md).
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace ellm {

// Checks q (quant_method "gptq" or "awq") and sets c.quant_method and c.int4; a variant ellm does
// not read fails with one line naming the field.
void parse_int4_quantization(const nlohmann::json& q, const std::string& where, ModelConfig& c);

}  // namespace ellm
