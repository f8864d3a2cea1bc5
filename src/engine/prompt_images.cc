#include "engine/prompt_images.h"

#include <string>

#include "model/config.h"

namespace ellm {
namespace {

int32_t image_identity(uint64_t hash, int64_t index) {
  uint64_t h = hash ^ (uint64_t(index) * 0x9E3779B97F4A7C15ull);
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return kImageIdentityFirst | int32_t(h & (uint64_t(kImageIdentityFirst) - 1));
}

[[noreturn]] void bad(const std::string& message) { throw RequestError("messages", message); }

}  // namespace

void adopt_prompt_images(GenerateRequest& request, const Model& model) {
  if (request.images.empty()) return;
  const int32_t pad = model.image_token_id();
  if (pad < 0) bad("this model has no vision tower: it takes text only (images are not supported)");
  const int64_t patch_floats = model.image_patch_floats(), n_prompt = int64_t(request.prompt.size());
  int64_t after_previous = 0;
  for (size_t i = 0; i < request.images.size(); ++i) {
    const PromptImage& image = request.images[i];
    const std::string which = "image " + std::to_string(i + 1);
    const int64_t patches = image.grid_t * image.grid_h * image.grid_w;
    if (image.grid_t != 1 || image.grid_h < 2 || image.grid_w < 2 || image.grid_h != 2 * image.merged_h ||
        image.grid_w != 2 * image.merged_w || !image.pixel_values ||
        int64_t(image.pixel_values->size()) != patches * patch_floats)
      bad(which + ": its patches do not match its grid");
    if (image.first < after_previous || image.first + image.n_tokens() > n_prompt)
      bad(which + ": its tokens lie outside the prompt or overlap another image");
    for (int64_t p = image.first; p < image.first + image.n_tokens(); ++p)
      if (request.prompt[p] != pad) bad(which + ": the prompt holds no <|image_pad|> run of its size there");
    after_previous = image.first + image.n_tokens();
  }
  for (const PromptImage& image : request.images)
    for (int64_t k = 0; k < image.n_tokens(); ++k)
      request.prompt[image.first + k] = image_identity(image.content_hash, k);
}

RequestImages::RequestImages(const std::vector<PromptImage>& images) : rows_(images.size()) {
  for (const PromptImage& image : images) places_.push_back({image.first, image.merged_h, image.merged_w});
}

ImageRows ImageRowCache::find(const PromptImage& image) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->hash != image.content_hash || it->grid_h != image.grid_h || it->grid_w != image.grid_w) continue;
    entries_.splice(entries_.begin(), entries_, it);
    return entries_.front().rows;
  }
  return nullptr;
}

void ImageRowCache::insert(const PromptImage& image, ImageRows rows) {
  const size_t size = rows->size() * sizeof(float);
  if (size > max_bytes_) return;
  while (bytes_ + size > max_bytes_) {
    bytes_ -= entries_.back().rows->size() * sizeof(float);
    entries_.pop_back();
  }
  entries_.push_front({image.content_hash, image.grid_h, image.grid_w, std::move(rows)});
  bytes_ += size;
}

int RequestImages::next_to_encode(ImageRowCache& cache, const std::vector<PromptImage>& images, int64_t from,
                                  int64_t& cache_hits) {
  for (size_t i = 0; i < places_.size(); ++i) {
    if (rows_[i] || places_[i].end() <= from) continue;
    rows_[i] = cache.find(images[i]);
    if (!rows_[i]) return int(i);
    ++cache_hits;
  }
  return -1;
}

BatchToken RequestImages::token(const Model& model, int32_t id, int32_t slot, int64_t p, bool want_logits) const {
  BatchToken out{id, slot, int32_t(p), want_logits};
  if (places_.empty()) return out;
  set_rope_position(out, places_);
  if (!is_image_identity(id)) return out;
  out.token = model.image_token_id();
  for (size_t i = 0; i < places_.size(); ++i) {
    if (p < places_[i].first || p >= places_[i].end()) continue;
    if (!rows_[i]) fail("RequestImages", "image " + std::to_string(i + 1) + "'s rows are not encoded before its pass");
    out.embedding = rows_[i]->data() + (p - places_[i].first) * model.config().hidden_size;
    return out;
  }
  fail("RequestImages", "an image pad id outside every image");
}

}  // namespace ellm
