#pragma once
// Reading config.json fields, each checked, for the architectures' config parsers: a missing
// or mistyped field is a one-line error naming the file and the field.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace ellm {

int64_t get_int(const nlohmann::json& j, const std::string& where, const char* key, bool required,
                int64_t fallback = 0);
double get_number(const nlohmann::json& j, const std::string& where, const char* key, double fallback);
bool get_bool(const nlohmann::json& j, const std::string& where, const char* key, bool fallback);
void require_positive(const std::string& where, const char* key, int64_t v);
// The fields every architecture spells alike (vocabulary, hidden size, layers, heads, head_dim,
// norm eps, ...), checked.
void parse_shared_fields(const nlohmann::json& j, const std::string& where, ModelConfig& c);

}  // namespace ellm
