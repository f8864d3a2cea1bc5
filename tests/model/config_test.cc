#include "model/config.h"
#include "tools/hf_config.h"

#include <gtest/gtest.h>

#include "model_test_util.h"

namespace ellm {
namespace {

using test::error_of;

const char* kDense = R"({
  "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 1024,
  "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
  "intermediate_size": 3072, "rope_theta": 1000000, "rms_norm_eps": 1e-06,
  "tie_word_embeddings": true, "max_position_embeddings": 40960, "rope_scaling": null,
  "hidden_act": "silu"})";

TEST(ModelConfig, ParsesQwen3DenseFields) {
  ModelConfig c = parse_model_config(kDense, "config.json");
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.head_dim, 128);  // from the config: 16 * 128 != 1024
  EXPECT_EQ(c.q_dim(), 2048);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.rope_theta, 1000000.0);  // an integer in the JSON
  EXPECT_FLOAT_EQ(float(c.rms_norm_eps), 1e-6f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.is_moe());
  for (int l = 0; l < 28; ++l) EXPECT_FALSE(c.is_moe_layer(l));
}

TEST(ModelConfig, ParsesQwen3MoeFieldsAndLayerKinds) {
  std::string text = test::read_text(test::shared_dir() + "/models/tiny-qwen3-moe/config.json");
  ModelConfig c = parse_model_config(text, "config.json");
  EXPECT_EQ(c.num_experts, 32);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_theta, 1000000.0);  // a float in the JSON
  EXPECT_TRUE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_FALSE(c.is_moe_layer(2));  // mlp_only_layers
  EXPECT_TRUE(c.is_moe_layer(3));
}

TEST(ModelConfig, DecoderSparseStepPicksEveryNthLayer) {
  ModelConfig c = preset_config("qwen3-30b-a3b");
  c.decoder_sparse_step = 2;
  ModelConfig parsed = parse_model_config(model_config_json(c), "config.json");
  EXPECT_FALSE(parsed.is_moe_layer(0));
  EXPECT_TRUE(parsed.is_moe_layer(1));
  EXPECT_FALSE(parsed.is_moe_layer(2));
  EXPECT_TRUE(parsed.is_moe_layer(3));
}

TEST(ModelConfig, WrittenConfigReadsBack) {
  for (const std::string& name : preset_names()) {
    ModelConfig c = preset_config(name);
    ModelConfig r = parse_model_config(model_config_json(c), "config.json");
    EXPECT_EQ(r.architecture, c.architecture) << name;
    EXPECT_EQ(r.hidden_size, c.hidden_size) << name;
    EXPECT_EQ(r.num_hidden_layers, c.num_hidden_layers) << name;
    EXPECT_EQ(r.head_dim, c.head_dim) << name;
    EXPECT_EQ(r.num_experts, c.num_experts) << name;
    EXPECT_EQ(r.mlp_only_layers, c.mlp_only_layers) << name;
    EXPECT_EQ(r.tie_word_embeddings, c.tie_word_embeddings) << name;
  }
}

TEST(ModelConfig, RejectsBadConfigsWithOneLineNamingTheFile) {
  auto parse = [](std::string text) {
    return error_of([&] { parse_model_config(text, "dir/config.json"); });
  };
  std::string unknown = kDense;
  unknown.replace(unknown.find("Qwen3ForCausalLM"), 16, "LlamaForCausalLM");
  EXPECT_EQ(parse(unknown),
            "dir/config.json: unsupported architecture 'LlamaForCausalLM' (expected "
            "Qwen3ForCausalLM or Qwen3MoeForCausalLM)");
  std::string no_hidden = kDense;
  no_hidden.replace(no_hidden.find("\"hidden_size\""), 13, "\"hidden_sizes\"");
  EXPECT_EQ(parse(no_hidden), "dir/config.json: missing field 'hidden_size'");
  EXPECT_NE(parse("{not json").find("dir/config.json: invalid JSON"), std::string::npos);
  std::string bad_heads = kDense;
  bad_heads.replace(bad_heads.find("\"num_key_value_heads\": 8"), 24, "\"num_key_value_heads\": 5");
  EXPECT_NE(parse(bad_heads).find("multiple of num_key_value_heads"), std::string::npos);
  std::string text_theta = kDense;
  text_theta.replace(text_theta.find("1000000,"), 8, "\"big\",");
  EXPECT_EQ(parse(text_theta), "dir/config.json: field 'rope_theta' must be a number");
  for (const std::string& message : {parse(unknown), parse(no_hidden), parse("[]")})
    EXPECT_EQ(message.find('\n'), std::string::npos);
}

TEST(ModelConfig, MissingConfigFileIsAClearError) {
  test::ScratchDir dir;
  std::string message = error_of([&] { load_model_config(dir.path); });
  EXPECT_EQ(message.rfind(dir.path + "/config.json: cannot open", 0), 0u) << message;
}

}  // namespace
}  // namespace ellm
