#pragma once
// Images in a prompt, as the engine handles them: checked against the model and the prompt at
// submit, their pads given ids of their own, encoded by the model's tower when a pass first needs
// them, and turned into the model's tokens (the tower's row as the embedding, the 3-D rope
// position).
//
// The ids: every <|image_pad|> id is the same, so a session cache keyed on token ids would take
// one screenshot's KV for another's. Each pad gets an id from its image's content hash and its
// index instead, at or above kImageIdentityFirst (far outside any vocabulary): the session store,
// the slots and the prefix matching compare contents without knowing about images, and only the
// pass maps the id back to <|image_pad|>.
#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "engine/request.h"
#include "model/model.h"
#include "model/rope.h"

namespace ellm {

constexpr int32_t kImageIdentityFirst = int32_t(1) << 30;
inline bool is_image_identity(int32_t id) { return id >= kImageIdentityFirst; }

// Throws RequestError (param "messages") for images the model cannot take or that do not match
// the prompt's pads; then gives the pads their ids.
void adopt_prompt_images(GenerateRequest& request, const Model& model);

using ImageRows = std::shared_ptr<const std::vector<float>>;  // [tokens][hidden]

// The tower's rows of recent images by content (hash and grid), within a byte budget, the least
// recently used dropped first: a screenshot sent again after its KV is gone (another
// conversation, an edited history, an evicted session) is not encoded again. The scheduler's
// thread alone uses it.
class ImageRowCache {
 public:
  explicit ImageRowCache(size_t max_bytes) : max_bytes_(max_bytes) {}
  ImageRows find(const PromptImage& image);  // null when not held
  void insert(const PromptImage& image, ImageRows rows);
  size_t bytes() const { return bytes_; }

 private:
  struct Entry {
    uint64_t hash;
    int64_t grid_h, grid_w;
    ImageRows rows;
  };
  std::list<Entry> entries_;  // most recently used first
  size_t bytes_ = 0, max_bytes_;
};

// A running request's images: where they sit, and the tower's rows once encoded.
class RequestImages {
 public:
  explicit RequestImages(const std::vector<PromptImage>& images);
  bool empty() const { return places_.empty(); }
  // The model's token for position p of a sequence whose id there is `id` (an image pad's id or
  // a token): a pad carries its image's row, which next_to_encode and hold gave before the pass.
  BatchToken token(const Model& model, int32_t id, int32_t slot, int64_t p, bool want_logits) const;
  // Before a pass: the first image not over by position `from` whose rows are not held. An
  // image found in the cache is held from it on the way (cache_hits counts those); returns the
  // index of the first one to encode, -1 when every image from `from` on has its rows.
  int next_to_encode(ImageRowCache& cache, const std::vector<PromptImage>& images, int64_t from,
                     int64_t& cache_hits);
  void hold(size_t image, ImageRows rows) { rows_[image] = std::move(rows); }

 private:
  std::vector<ImagePlacement> places_;
  std::vector<ImageRows> rows_;  // per image; null until first needed
};

}  // namespace ellm
