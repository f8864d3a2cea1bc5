#include "cli/generation_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace ellm {

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail(path, "not a JSON object");
  return j;
}

// eos_token_id is an int or a list of ints.
void add_eos(const nlohmann::json& j, const std::string& path, std::vector<int32_t>& ids) {
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return;
  auto add = [&](const nlohmann::json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0) fail(path, "'eos_token_id' must be a token id or a list of them");
    ids.push_back(x.get<int32_t>());
  };
  if (it->is_array()) for (const auto& x : *it) add(x);
  else add(*it);
}

template <class T>
void read_number(const nlohmann::json& j, const char* key, const std::string& path, T& into) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (!it->is_number()) fail(path, std::string("'") + key + "' must be a number");
  into = it->get<T>();
}

}  // namespace

GenerationDefaults load_generation_defaults(const std::string& model_dir) {
  GenerationDefaults d;
  const std::string path = model_dir + "/generation_config.json";
  if (!std::filesystem::exists(path)) {
    const std::string config = model_dir + "/config.json";
    if (std::filesystem::exists(config)) add_eos(read_json(config), config, d.eos_token_ids);
    return d;
  }
  nlohmann::json j = read_json(path);
  add_eos(j, path, d.eos_token_ids);
  read_number(j, "temperature", path, d.sampling.temperature);
  read_number(j, "top_p", path, d.sampling.top_p);
  read_number(j, "top_k", path, d.sampling.top_k);
  read_number(j, "min_p", path, d.sampling.min_p);
  read_number(j, "repetition_penalty", path, d.sampling.repetition_penalty);
  return d;
}

}  // namespace ellm
