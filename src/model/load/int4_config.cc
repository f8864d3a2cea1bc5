#include "model/load/int4_config.h"

#include "base/error.h"

namespace ellm {
namespace {

using nlohmann::json;

// The value of the first of `keys` present (AutoAWQ spells some keys its own way), or null.
json field(const json& q, std::initializer_list<const char*> keys, std::string* key_used) {
  for (const char* key : keys) {
    auto it = q.find(key);
    if (it != q.end() && !it->is_null()) {
      *key_used = key;
      return *it;
    }
  }
  *key_used = *keys.begin();
  return nullptr;
}

}  // namespace

void parse_int4_quantization(const json& q, const std::string& where, ModelConfig& c) {
  const std::string method = q["quant_method"].get<std::string>();
  auto unsupported = [&](const std::string& key, const json& value, const std::string& only) {
    fail(where, "quantization_config." + key + " " +
                    (value.is_string() ? "'" + value.get<std::string>() + "'" : value.dump()) +
                    " is not supported (" + only + ")");
  };
  std::string key;
  json bits = field(q, {"bits", "w_bit"}, &key);
  if (bits.is_null()) fail(where, "quantization_config has no 'bits'");
  if (bits != 4) unsupported(key, bits, "only 4-bit weights");
  json group = field(q, {"group_size", "q_group_size"}, &key);
  if (group.is_null()) fail(where, "quantization_config has no 'group_size'");
  if (!group.is_number_integer() || (group.get<int64_t>() <= 0 && group != -1))
    unsupported(key, group, "a positive number of inputs, or -1 for all of them");
  c.int4.group_size = group.get<int64_t>();

  if (method == "gptq") {
    json format = field(q, {"checkpoint_format"}, &key);
    c.int4.format = format.is_null() ? "gptq" : format.is_string() ? format.get<std::string>() : "";
    if (c.int4.format != "gptq" && c.int4.format != "gptq_v2")
      unsupported(key, format, "only \"gptq\" or \"gptq_v2\"");
    // GPTQModel's per-module rules: "-:" keys leave modules unquantised, which the tensors show;
    // any other rule changes bits or groups per module.
    json dynamic = field(q, {"dynamic"}, &key);
    if (dynamic.is_object())
      for (auto& [rule, value] : dynamic.items())
        if (rule.rfind("-:", 0) != 0)
          fail(where, "quantization_config.dynamic rule '" + rule +
                          "' changes a module's quantisation: not supported");
  } else {
    json version = field(q, {"version"}, &key);
    if (!version.is_null() && (!version.is_string() || (version != "gemm" && version != "GEMM")))
      unsupported(key, version, "only \"gemm\"");
    json zero_point = field(q, {"zero_point"}, &key);
    if (!zero_point.is_null() && zero_point != true)
      unsupported(key, zero_point, "only true");
    if (c.int4.group_size == -1) unsupported("group_size", group, "AWQ needs groups");
    c.int4.format = "awq";
  }
  c.quant_method = method;
}

}  // namespace ellm
