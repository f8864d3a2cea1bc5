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

// A running request's images: where they sit, and the tower's rows once encoded.
class RequestImages {
 public:
  explicit RequestImages(const std::vector<PromptImage>& images);
  bool empty() const { return places_.empty(); }
  // The model's token for position p of a sequence whose id there is `id` (an image pad's id or
  // a token); encodes the image the first time one of its pads is asked for. Returns whether it
  // encoded.
  bool token(Model& model, const std::vector<PromptImage>& images, int32_t id, int32_t slot, int64_t p,
             bool want_logits, BatchToken& out);

 private:
  std::vector<ImagePlacement> places_;
  std::vector<std::vector<float>> rows_;  // per image: [tokens][hidden], empty until encoded
};

}  // namespace ellm
