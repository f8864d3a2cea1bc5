// make-model's Qwen3.5-generation presets load and run, in BF16 and FP8, with fused and
// per-expert MoE layouts. By default at a cut width (hidden 256, 8 experts, vocabulary 1024) so
// the suite stays small; ELLM_LARGE_TESTS=1 runs the presets' real widths (vocabulary still
// cut: a few GiB per model).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "model/config.h"
#include "tools/hf_config.h"
#include "model/model.h"
#include "model_test_util.h"
#include "tools/make_model.h"

namespace ellm {
namespace {

ModelConfig cut(const std::string& preset, bool large) {
  ModelConfig c = preset_config(preset);
  c.num_hidden_layers = 4;
  c.linear_attention = {true, true, true, false};
  c.vocab_size = large ? 4096 : 1024;
  if (!large) {
    c.hidden_size = 256;
    if (c.is_moe()) c.num_experts = 8;
    else c.intermediate_size = 512;
  }
  return c;
}

TEST(Qwen35Presets, CutToFourLayersLoadAndRunInBf16AndFp8FusedAndPerExpert) {
  const bool large = std::getenv("ELLM_LARGE_TESTS") != nullptr;
  for (const std::string preset : {"qwen3.6-27b", "qwen3.6-35b-a3b", "qwen3.5-0.8b"}) {
    const ModelConfig config = cut(preset, large);
    size_t bf16_bytes = 0;
    for (bool fp8 : {false, true})
      for (bool fused : {false, true}) {
        if (fused && (fp8 || !config.is_moe())) continue;  // FP8 checkpoints are per expert
        const std::string what = preset + (fp8 ? " fp8" : " bf16") + (fused ? " fused" : "");
        test::ScratchDir dir;
        write_random_model(config, dir.path, 7, /*shards=*/2, {}, fp8 ? "fp8" : "bf16", fused);
        ServingLimits limits;
        limits.sequence_length = 16;
        limits.threads = 2;
        auto model = Model::load(dir.path, limits);
        EXPECT_TRUE(model->has_recurrent_state()) << what;
        EXPECT_EQ(model->config().num_experts, config.num_experts) << what;
        std::vector<BatchToken> prompt = {{1, 0, 0, false}, {2, 0, 1, false}, {3, 0, 2, true}};
        std::vector<BatchToken> step = {{4, 0, 3, true}};
        std::vector<float> logits(size_t(model->vocab_size()), NAN);
        model->forward(prompt, logits.data());
        model->forward(step, logits.data());
        for (float v : logits) ASSERT_TRUE(std::isfinite(v)) << what;
        if (!fp8 && !fused) bf16_bytes = model->weight_bytes();
        // FP8 halves the decoder's linear weights (embedding, lm_head, in_proj_a/b, the
        // router and the norms stay as they are).
        if (fp8) EXPECT_LT(double(model->weight_bytes()), 0.8 * double(bf16_bytes)) << what;
        std::printf("[%s] weights %.1f MiB, state %.1f KiB per slot, KV %zu B per token\n",
                    what.c_str(), double(model->weight_bytes()) / (1 << 20),
                    double(model->state_bytes_per_slot()) / 1024, model->kv_bytes_per_token());
      }
  }
}

TEST(Qwen35Presets, RealShapesHaveTheStateAndKvSizesOfTheNote) {
  // docs/models/qwen35.md: the recurrent state per GDN layer and the KV per token at full depth.
  ModelConfig c27 = preset_config("qwen3.6-27b"), c35 = preset_config("qwen3.6-35b-a3b");
  EXPECT_EQ(c27.conv_dim(), 10240);
  EXPECT_EQ(c35.conv_dim(), 8192);
  int64_t full = 0;
  for (int64_t l = 0; l < c27.num_hidden_layers; ++l) full += !c27.is_linear_layer(l);
  EXPECT_EQ(full, 16);
  EXPECT_EQ(full * 2 * c27.kv_dim() * 2, 65536);  // KV per token, FP16
  EXPECT_EQ(c27.rotary_dim(), 64);
  ModelConfig back = parse_model_config(model_config_json(c35), "config.json");
  EXPECT_EQ(back.model_type, "qwen3_5_moe");
  EXPECT_EQ(back.shared_expert_intermediate_size, 512);
  EXPECT_EQ(back.linear_attention, c35.linear_attention);
  EXPECT_EQ(back.vocab_size, 248320);
}

}  // namespace
}  // namespace ellm
