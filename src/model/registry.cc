#include "model/registry.h"

#include "base/error.h"
#include "base/threads.h"
#include "model/arch/qwen3.h"
#include "model/arch/qwen35.h"
#include "model/arch/qwen4exp.h"

namespace ellm {
namespace {

template <class Arch>
std::unique_ptr<Model> load_as(const std::string& model_dir, const ModelConfig& config,
                               const ServingLimits& limits, std::shared_ptr<ThreadTeam> team) {
  return std::make_unique<Arch>(model_dir, config, limits, std::move(team));
}

const Architecture kArchitectures[] = {
    {{"qwen3", "qwen3_moe"}, {""}, parse_qwen3_config, load_as<Qwen3Model>},
    {{"qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text"}, {"qwen3_5_text"}, parse_qwen35_config, load_as<Qwen35Model>},
    {{"qwen4_exp", "qwen3_8_flash_next"}, {"qwen4_exp_text"}, parse_qwen4exp_config, load_as<Qwen4ExpModel>},
};

}  // namespace

const Architecture* find_architecture(const std::string& model_type) {
  for (const Architecture& a : kArchitectures)
    for (const auto* names : {&a.model_types, &a.also})
      for (const std::string& name : *names)
        if (name == model_type) return &a;
  return nullptr;
}

std::string supported_model_types() {
  std::vector<std::string> names;
  for (const Architecture& a : kArchitectures) names.insert(names.end(), a.model_types.begin(), a.model_types.end());
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return out;
}

std::unique_ptr<Model> Model::load(const std::string& model_dir, const ServingLimits& limits,
                                   Model* share_threads) {
  const ModelConfig config = load_model_config(model_dir);
  std::shared_ptr<ThreadTeam> team = share_threads ? share_threads->thread_team() : nullptr;
  return find_architecture(config.model_type)->load(model_dir, config, limits, std::move(team));
}

void Model::encode_image(const float* pixel_values, int64_t grid_t, int64_t grid_h, int64_t grid_w,
                         float* rows) {
  begin_image(pixel_values, grid_t, grid_h, grid_w, rows);
  while (!image_stage()) {
  }
}

void Model::begin_image(const float*, int64_t, int64_t, int64_t, float*) {
  fail("encode_image", "this model has no vision tower loaded");
}

bool Model::image_stage() { fail("encode_image", "this model has no vision tower loaded"); }

void Model::fail_no_mtp() {
  fail("mtp_forward", "this model has no multi-token-prediction head loaded");
}

}  // namespace ellm
