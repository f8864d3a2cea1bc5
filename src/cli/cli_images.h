#pragma once
// Images from the command line: `ellm logits --images IMAGES.json` puts each image's tower rows
// at its run of <|image_pad|> ids with the 3-D positions that follow (the golden check of
// shared/golden/tiny-qwen35-vl); and the image processor settings of a model folder.
#include <cstdint>
#include <string>
#include <vector>

#include "image/processor.h"
#include "model/model.h"
#include "model/rope.h"

namespace ellm {

// The folder's preprocessor_config.json; without one (a folder made by hand), the settings Qwen3.5
// ships, as the tower's patches need them (with a warning).
ImageProcessorConfig image_processor_of(const std::string& model_dir);

struct CliImages {
  std::vector<ImagePlacement> places;
  std::vector<std::vector<float>> rows;  // per image: [tokens][hidden]
  int64_t hidden = 0;
  // Sets t's rope position, and its embedding when it is one of an image's pads.
  void apply(BatchToken& t) const;
};

// IMAGES.json: a list of {"file", "first_token_index"} (or an object holding it as "images",
// such as a golden session.json), files relative to the JSON's folder; each decoded, prepared and
// encoded by the model's tower. Throws Error naming the file and the problem.
CliImages load_cli_images(const std::string& path, Model& model, const std::string& model_dir);

}  // namespace ellm
