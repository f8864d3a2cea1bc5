#pragma once
// The architectures ellm serves, by the model_type of their config.json: each brings its config
// parser and its model. Adding an architecture means one file pair under arch/ and one line in
// registry.cc.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/model.h"

namespace ellm {

struct Architecture {
  std::vector<std::string> model_types;  // named in the error for an unknown one
  std::vector<std::string> also;         // accepted too, not named
  // Fills the config from config.json (throws naming `where` and the field).
  void (*parse)(const nlohmann::json& config_json, const std::string& where, ModelConfig& c);
  std::unique_ptr<Model> (*load)(const std::string& model_dir, const ModelConfig& config,
                                 const ServingLimits& limits, std::shared_ptr<ThreadTeam> team);
};

// The architecture of a model_type ("" is Qwen3's: its configs may leave it out); null if none.
const Architecture* find_architecture(const std::string& model_type);
// "qwen3, qwen3_moe, ... and qwen3_5_moe_text": the model types the error for an unknown one lists.
std::string supported_model_types();

}  // namespace ellm
