#include "cli/cli_images.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/log.h"
#include "image/decode.h"

namespace ellm {

ImageProcessorConfig image_processor_of(const std::string& model_dir) {
  if (std::filesystem::exists(std::filesystem::path(model_dir) / "preprocessor_config.json"))
    return ImageProcessorConfig::load(model_dir);
  log_warn(model_dir + " has no preprocessor_config.json: images use Qwen3.5's shipped settings "
           "(65536 to 16777216 pixels, mean and std 0.5)");
  ImageProcessorConfig c;
  c.min_pixels = 65536;
  c.max_pixels = 16777216;
  for (int i = 0; i < 3; ++i) c.mean[i] = c.std[i] = 0.5f;
  return c;
}

void CliImages::apply(BatchToken& t) const {
  set_rope_position(t, places);
  for (size_t i = 0; i < places.size(); ++i)
    if (t.position >= places[i].first && t.position < places[i].end())
      t.embedding = rows[i].data() + (t.position - places[i].first) * hidden;
}

CliImages load_cli_images(const std::string& path, Model& model, const std::string& model_dir) {
  std::ifstream in(path);
  if (!in) fail(path, "cannot be read");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_object() && j.contains("images")) j = j["images"];
  if (!j.is_array()) fail(path, "must be a list of {\"file\", \"first_token_index\"} (or hold one as \"images\")");
  if (!j.empty() && model.image_token_id() < 0) fail(model_dir, "has no vision tower: it takes no images");
  const ImageProcessorConfig processor = image_processor_of(model_dir);
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  CliImages out;
  out.hidden = model.config().hidden_size;
  for (const auto& entry : j) {
    if (!entry.is_object() || !entry.contains("file") || !entry["file"].is_string() ||
        !entry.contains("first_token_index") || !entry["first_token_index"].is_number_integer())
      fail(path, "each image needs a string 'file' and an integer 'first_token_index'");
    const std::string file = (folder / entry["file"].get<std::string>()).string();
    std::ifstream image(file, std::ios::binary);
    if (!image) fail(file, "cannot be read");
    const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(image), std::istreambuf_iterator<char>()};
    PreparedImage prepared;
    try {
      prepared = prepare_image(decode_image(bytes), processor);
    } catch (const Error& e) {
      fail(file, e.what());
    }
    const int64_t first = entry["first_token_index"].get<int64_t>();
    if (first < 0 || (!out.places.empty() && first < out.places.back().end()))
      fail(path, "images must come in order, their token runs apart");
    out.places.push_back({first, prepared.merged_h(), prepared.merged_w()});
    out.rows.emplace_back(size_t(prepared.n_tokens() * out.hidden));
    model.encode_image(prepared.pixel_values.data(), prepared.grid_t, prepared.grid_h, prepared.grid_w,
                       out.rows.back().data());
  }
  return out;
}

}  // namespace ellm
