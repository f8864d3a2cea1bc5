#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "model/config_fields.h"

namespace ellm {

using nlohmann::json;

namespace {

// transformers' get_mscale: 0.1 * mscale * ln(factor) + 1, and 1 for no scaling.
double yarn_mscale(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

// The dim (fractional) whose wavelength completes `rotations` turns over the original window.
double correction_dim(double rotations, int64_t dim, double theta, double window) {
  return double(dim) * std::log(window / (rotations * 2 * M_PI)) / (2 * std::log(theta));
}

void check_yarn(const RopeScaling& s, const std::string& where) {
  if (!(s.factor >= 1)) fail(where, "YaRN factor must be at least 1");
  if (s.original_max_position_embeddings <= 0)
    fail(where, "YaRN original_max_position_embeddings must be positive");
  if (!(s.beta_fast > 0 && s.beta_slow > 0)) fail(where, "YaRN beta_fast and beta_slow must be positive");
  if (!(s.attention_factor > 0)) fail(where, "YaRN attention_factor must be positive");
}

}  // namespace

void parse_mrope(const json& rope, const std::string& where, ModelConfig& c) {
  auto it = rope.find("mrope_section");
  if (it == rope.end() || it->is_null()) return;
  if (!it->is_array() || it->size() != 3)
    fail(where, "field 'mrope_section' must be an array of three counts");
  for (int i = 0; i < 3; ++i) {
    if (!(*it)[i].is_number_integer() || (*it)[i].get<int64_t>() < 0)
      fail(where, "field 'mrope_section' must hold non-negative integers");
    c.mrope_section[i] = (*it)[i].get<int64_t>();
  }
  c.mrope_interleaved = get_bool(rope, where, "mrope_interleaved", false);
}

void check_mrope(const std::string& where, const ModelConfig& c) {
  const auto& section = c.mrope_section;
  const int64_t sections = section[0] + section[1] + section[2];
  if (sections != 0 && sections != c.rotary_dim() / 2)
    fail(where, "mrope_section sums to " + std::to_string(sections) + ", not the " +
                    std::to_string(c.rotary_dim() / 2) + " rotary frequencies");
}

void parse_rope_type(const json& object, const std::string& where, const char* key, ModelConfig& c) {
  if (object.is_null()) return;
  if (!object.is_object()) fail(where, "field '" + std::string(key) + "' must be an object");
  auto type = object.find("rope_type");
  if (type == object.end()) type = object.find("type");
  const std::string name = type == object.end() || type->is_null() ? "default"
                           : type->is_string()                      ? type->get<std::string>()
                                                                    : type->dump();
  if (name == "default" || name == "mrope") return;  // mRoPE with text positions is plain RoPE
  if (name != "yarn")
    fail(where, std::string(key) + ": rope type '" + name + "' is not supported (supported: default, yarn)");

  RopeScaling& s = c.rope_scaling;
  s.type = "yarn";
  s.original_max_position_embeddings =
      get_int(object, where, "original_max_position_embeddings", false, c.max_position_embeddings);
  require_positive(where, "original_max_position_embeddings", s.original_max_position_embeddings);
  // transformers 5: a missing factor is max_position_embeddings over the original window.
  s.factor = get_number(object, where, "factor",
                        double(c.max_position_embeddings) / double(s.original_max_position_embeddings));
  // beta_fast / beta_slow: `or 32` / `or 1` in transformers, so 0 or null takes the default too.
  s.beta_fast = get_number(object, where, "beta_fast", 0);
  s.beta_slow = get_number(object, where, "beta_slow", 0);
  if (s.beta_fast == 0) s.beta_fast = 32;
  if (s.beta_slow == 0) s.beta_slow = 1;
  s.truncate = get_bool(object, where, "truncate", true);
  const double mscale = get_number(object, where, "mscale", 0);
  const double mscale_all_dim = get_number(object, where, "mscale_all_dim", 0);
  // attention_factor, else the mscale ratio (DeepSeek's spelling), else 0.1 ln(factor) + 1.
  const double given = get_number(object, where, "attention_factor", 0);
  s.attention_factor = given != 0                            ? given
                       : mscale != 0 && mscale_all_dim != 0 ? yarn_mscale(s.factor, mscale) /
                                                                  yarn_mscale(s.factor, mscale_all_dim)
                                                            : yarn_mscale(s.factor, 1);
  check_yarn(s, where + " " + key);
}

RopeScaling parse_rope_scaling_flag(const std::string& spec, const std::string& where) {
  RopeScaling s;
  if (spec.empty() || spec == "none" || spec == "default") return s;
  const auto usage = [&] {
    fail(where, "expected yarn:FACTOR[:ORIGINAL] (e.g. yarn:4 or yarn:4:32768), got '" + spec + "'");
  };
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    size_t colon = spec.find(':', at);
    parts.push_back(spec.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  if (parts[0] != "yarn")
    fail(where, "rope type '" + parts[0] + "' is not supported (supported: default, yarn)");
  if (parts.size() < 2 || parts.size() > 3) usage();
  try {
    size_t used = 0;
    s.factor = std::stod(parts[1], &used);
    if (used != parts[1].size()) usage();
    if (parts.size() == 3) {
      s.original_max_position_embeddings = std::stoll(parts[2], &used);
      if (used != parts[2].size() || s.original_max_position_embeddings <= 0) usage();
    }
  } catch (const std::logic_error&) {
    usage();
  }
  if (!(s.factor >= 1) || !std::isfinite(s.factor)) fail(where, "the YaRN factor must be at least 1");
  s.type = "yarn";
  s.attention_factor = yarn_mscale(s.factor, 1);
  return s;
}

void apply_rope_scaling(ModelConfig& c, const RopeScaling& flag) {
  if (!flag.is_yarn()) return;
  c.rope_scaling = flag;
  if (c.rope_scaling.original_max_position_embeddings == 0)
    c.rope_scaling.original_max_position_embeddings = c.max_position_embeddings;
  check_yarn(c.rope_scaling, "--rope-scaling");
}

int64_t ModelConfig::context_window() const {
  if (!rope_scaling.is_yarn()) return max_position_embeddings;
  const double scaled = double(rope_scaling.original_max_position_embeddings) * rope_scaling.factor;
  return std::max(max_position_embeddings, int64_t(scaled));
}

std::string rope_format(const ModelConfig& c) {
  std::string out = "rope_theta=" + std::to_string(c.rope_theta);
  const RopeScaling& s = c.rope_scaling;
  if (s.is_yarn())
    out += " yarn=" + std::to_string(s.factor) + "," + std::to_string(s.original_max_position_embeddings) + "," +
           std::to_string(s.beta_fast) + "," + std::to_string(s.beta_slow) + "," +
           std::to_string(s.attention_factor) + (s.truncate ? "" : ",untruncated");
  return out;
}

std::pair<double, double> yarn_correction_range(const RopeScaling& s, int64_t dim, double theta) {
  const double window = double(s.original_max_position_embeddings);
  double low = correction_dim(s.beta_fast, dim, theta, window);
  double high = correction_dim(s.beta_slow, dim, theta, window);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  return {std::max(low, 0.0), std::min(high, double(dim - 1))};
}

namespace {

// transformers' apply_interleaved_mrope: frequency i turns with H when i % 3 == 1 and i < 3 *
// section[1], with W when i % 3 == 2 and i < 3 * section[2], else with T; without interleaving
// the three sections are runs T.., H.., W.. .
std::vector<uint8_t> mrope_axes(const ModelConfig& c) {
  const auto& section = c.mrope_section;
  const int64_t half = c.rotary_dim() / 2;
  if (section[0] + section[1] + section[2] == 0) return {};
  std::vector<uint8_t> axis(size_t(half), 0);
  for (int64_t i = 0; i < half; ++i) {
    if (c.mrope_interleaved) {
      if (i % 3 == 1 && i < 3 * section[1]) axis[i] = 1;
      if (i % 3 == 2 && i < 3 * section[2]) axis[i] = 2;
    } else {
      axis[i] = i < section[0] ? 0 : i < section[0] + section[1] ? 1 : 2;
    }
  }
  return axis;
}

}  // namespace

RopeTable rope_table(const ModelConfig& c) {
  RopeTable t;
  const int64_t rd = c.rotary_dim();
  const float theta = float(c.rope_theta);
  // HF: inv_freq = 1 / theta^(arange(0, d, 2) / d) over the d rotary dims, in FP32.
  for (int64_t i = 0; i < rd / 2; ++i) t.inv_freq.push_back(1.0f / std::pow(theta, float(2 * i) / float(rd)));
  t.axis = mrope_axes(c);
  if (!c.rope_scaling.is_yarn()) return t;

  // YaRN: dims below `low` keep their frequency (extrapolation), dims above `high` divide it by
  // the factor (interpolation), a linear ramp between; FP32 as transformers forms them.
  const RopeScaling& s = c.rope_scaling;
  auto [low, high] = yarn_correction_range(s, rd, c.rope_theta);
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  const float factor = float(s.factor), lo = float(low), span = float(high - low);
  for (int64_t i = 0; i < rd / 2; ++i) {
    const float pos_freq = std::pow(theta, float(2 * i) / float(rd));
    const float extrapolated = 1.0f / pos_freq, interpolated = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp((float(i) - lo) / span, 0.0f, 1.0f);
    const float keep = 1.0f - ramp;
    t.inv_freq[i] = interpolated * (1.0f - keep) + extrapolated * keep;
  }
  t.attention_factor = float(s.attention_factor);
  return t;
}

void token_rope_angles(const BatchToken& t, const RopeTable& table, float* cos, float* sin) {
  const int64_t half = int64_t(table.inv_freq.size());
  if (t.rope[0] < 0 || table.axis.empty())
    rope_angles(t.position, table.inv_freq.data(), half, table.attention_factor, cos, sin);
  else
    rope_angles_thw(t.rope, table.axis.data(), table.inv_freq.data(), half, table.attention_factor, cos, sin);
}

std::array<int32_t, 3> rope_position(std::span<const ImagePlacement> images, int64_t index) {
  int64_t shift = 0;  // rope position - index, from the images before `index`
  for (const ImagePlacement& image : images) {
    if (index < image.first) break;
    const int64_t start = image.first + shift;
    if (index < image.end()) {
      const int64_t k = index - image.first;
      return {int32_t(start), int32_t(start + k / image.merged_w), int32_t(start + k % image.merged_w)};
    }
    shift += std::max(image.merged_h, image.merged_w) - (image.end() - image.first);
  }
  const auto p = int32_t(index + shift);
  return {p, p, p};
}

void set_rope_position(BatchToken& t, std::span<const ImagePlacement> images) {
  const std::array<int32_t, 3> thw = rope_position(images, t.position);
  const bool text = thw[0] == t.position && thw[1] == t.position && thw[2] == t.position;
  for (int i = 0; i < 3; ++i) t.rope[i] = text ? -1 : thw[i];
}

}  // namespace ellm
