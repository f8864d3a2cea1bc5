// Images in chat messages (issue 40): the image parts read, decoded and prepared for the vision
// tower, and each image's <|image_pad|> (the template writes one) widened to its token count in
// the tokenized prompt. The Messages and Responses APIs arrive here as chat image_url parts.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "image/decode.h"
#include "server/api_response.h"
#include "server/server_impl.h"

namespace ellm {
namespace {

// The URL of an image part, or nullptr when the part is not an image: {"type": "image_url",
// "image_url": {"url": ...}} (OpenAI), or what the Qwen templates also render as an image (a
// part with an "image" or "image_url" key, or of type "image").
const nlohmann::ordered_json* image_url_of(const nlohmann::ordered_json& part, const std::string& where) {
  if (!part.is_object()) return nullptr;
  const std::string type = part.contains("type") && part["type"].is_string() ? part["type"].get<std::string>() : "";
  const bool image = type == "image_url" || type == "image" || part.contains("image_url") || part.contains("image");
  if (!image) return nullptr;
  for (const char* key : {"image_url", "image"}) {
    auto it = part.find(key);
    if (it == part.end()) continue;
    if (it->is_string()) return &*it;
    if (it->is_object() && it->contains("url") && (*it)["url"].is_string()) return &(*it)["url"];
  }
  throw_bad_request(where + ": an image part needs 'image_url': {'url': 'data:image/...;base64,...'}", "messages");
}

std::vector<uint8_t> read_local_image(const std::string& url, const std::string& allowed, const std::string& where) {
  namespace fs = std::filesystem;
  if (allowed.empty())
    throw_bad_request(where + ": file:// image URLs are off (serve --allowed-local-media-path DIR allows a folder)",
                      "messages");
  std::error_code error;
  const fs::path path = fs::weakly_canonical(url.substr(7), error);
  const fs::path root = fs::weakly_canonical(allowed, error);
  const auto rel = path.lexically_relative(root);
  if (error || rel.empty() || *rel.begin() == "..")
    throw_bad_request(where + ": " + url + " is outside --allowed-local-media-path", "messages");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_bad_request(where + ": cannot read " + url, "messages");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

std::vector<PreparedImage> Server::Impl::chat_images(const nlohmann::ordered_json& messages) const {
  std::vector<PreparedImage> images;
  for (size_t m = 0; m < messages.size(); ++m) {
    const auto& content = messages[m].contains("content") ? messages[m]["content"] : nlohmann::ordered_json();
    if (!content.is_array()) continue;
    for (size_t p = 0; p < content.size(); ++p) {
      const std::string where = "messages[" + std::to_string(m) + "].content[" + std::to_string(p) + "]";
      const nlohmann::ordered_json* url = image_url_of(content[p], where);
      if (!url) continue;
      if (!options.image_processor)
        throw_bad_request(where + ": this model takes text only (it has no vision tower)", "messages");
      const std::string& text = url->get_ref<const std::string&>();
      std::vector<uint8_t> bytes;
      try {
        if (text.rfind("data:", 0) == 0)
          bytes = decode_data_uri(text);
        else if (text.rfind("file://", 0) == 0)
          bytes = read_local_image(text, options.allowed_local_media_path, where);
        else
          throw_bad_request(where + ": image URLs are not fetched; send the image as a data: URI", "messages");
        images.push_back(prepare_image(decode_image(bytes), *options.image_processor));
      } catch (const Error& e) {
        throw_bad_request(where + ": " + e.what(), "messages");
      }
    }
  }
  return images;
}

void Server::Impl::place_images(std::vector<PreparedImage> images, GenerateRequest& g) const {
  if (images.empty()) return;
  int64_t total = 0;
  for (const auto& image : images) total += image.n_tokens();
  if (options.max_image_tokens > 0 && total > options.max_image_tokens)
    throw_bad_request("the images take " + std::to_string(total) + " tokens, more than this server's " +
                          std::to_string(options.max_image_tokens) + " (--max-image-tokens)",
                      "messages");
  const int32_t pad = engine.image_token_id();
  std::vector<int32_t> ids;
  ids.reserve(g.prompt.size() + size_t(total));
  size_t next = 0;
  const int64_t history_end = g.history_end, system_end = g.system_end;
  for (size_t i = 0; i < g.prompt.size(); ++i) {
    if (g.prompt[i] != pad) {
      ids.push_back(g.prompt[i]);
      continue;
    }
    if (next == images.size()) throw_bad_request("the prompt holds more image places than images", "messages");
    PreparedImage& image = images[next++];
    const int64_t added = image.n_tokens() - 1;
    if (int64_t(i) < history_end) g.history_end += added;
    if (int64_t(i) < system_end) g.system_end += added;
    PromptImage placed;
    placed.first = int64_t(ids.size());
    placed.grid_t = image.grid_t;
    placed.grid_h = image.grid_h;
    placed.grid_w = image.grid_w;
    placed.merged_h = image.merged_h();
    placed.merged_w = image.merged_w();
    placed.content_hash = image.content_hash;
    placed.pixel_values = std::make_shared<const std::vector<float>>(std::move(image.pixel_values));
    ids.insert(ids.end(), size_t(image.n_tokens()), pad);
    g.images.push_back(std::move(placed));
  }
  if (next != images.size())
    throw_bad_request("the chat template placed " + std::to_string(next) + " of the " + std::to_string(images.size()) +
                          " images (it has no place for an image part there)",
                      "messages");
  g.prompt = std::move(ids);
}

}  // namespace ellm
