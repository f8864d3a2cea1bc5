// The images the prefilling slots will need, before the pass that feeds them: each taken from
// the image cache or encoded by the model's tower in its stages (model.h: begin_image,
// image_stage). A screenshot's tower takes seconds on a few cores; between two stages, when the
// generating slots would otherwise wait past the stall limit (max_decode_stall_seconds), they
// get a decode step, as between the parts of a long prefill (pass.cc).
#include <algorithm>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/scheduler/scheduler.h"

namespace ellm {

void Scheduler::encode_images() {
  for (int s = 0; s < int(active_.size()); ++s) {
    for (;;) {
      ActiveRequest* request = active_[s].get();
      if (!request || request->images.empty() || int64_t(slots_[s].tokens.size()) >= request->prompt_len) break;
      const int image = request->images.next_to_encode(image_rows_, request->request.images,
                                                       int64_t(slots_[s].tokens.size()),
                                                       local_metrics_.image_cache_hits_total);
      if (image < 0 || !encode_image(s, image)) break;
    }
  }
}

// Encodes image `image` of slot s's request and holds its rows there and in the cache. Returns
// false when it was left unfinished and the request ended: cancelled, failed, or the scheduler
// stopping.
bool Scheduler::encode_image(int s, int image) {
  ActiveRequest& request = *active_[s];
  const PromptImage& what = request.request.images[size_t(image)];
  const std::shared_ptr<const std::vector<float>> pixels = what.pixel_values;  // alive however it goes
  auto rows = std::make_shared<std::vector<float>>(size_t(what.n_tokens() * model_.config().hidden_size));
  const double stall = options_.max_decode_stall_seconds;
  double longest_stage = 0;  // the next stage's estimate: attention and MLP stages differ
  try {
    for (bool begun = false;;) {
      const auto start = Clock::now();
      if (!begun) {  // the patch embedding: a stage too
        model_.begin_image(pixels->data(), what.grid_t, what.grid_h, what.grid_w, rows->data());
        begun = true;
      } else if (model_.image_stage()) {
        break;
      }
      longest_stage = std::max(longest_stage, seconds_between(start, Clock::now()));
      bool stopping = false;
      {
        std::lock_guard lock(mutex_);
        stopping = stopping_;
      }
      if (stopping || request.stream->cancelled()) {  // the KV of the tokens before it stays good
        finish(s, FinishReason::abort);
        return false;
      }
      if (stall > 0 && seconds_between(last_tokens_at_, Clock::now()) + longest_stage + decode_step_seconds_ >= stall)
        decode_between_parts();
    }
  } catch (const std::exception& e) {  // this request's image only; the others go on
    finish(s, FinishReason::error, std::string("image encoding failed: ") + e.what());
    return false;
  }
  request.images.hold(size_t(image), rows);
  image_rows_.insert(what, rows);
  ++local_metrics_.images_encoded_total;
  return true;
}

}  // namespace ellm
