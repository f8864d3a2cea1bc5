// The hybrid Qwen3.5 generation: its configs in every spelling, bad folders, both expert
// layouts, the recurrent state carried across passes in any chunking, and the rule that a slot
// resumes only with its state. (The shared goldens are in golden_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "base/cpu.h"
#include "model/config.h"
#include "model/model.h"
#include "model/load/safetensors.h"
#include "model_test_util.h"
#include "tiers_under_test.h"

namespace ellm {
namespace {

using test::error_of;
using test::load_error;

using test::shared_model;

ServingLimits qwen35_limits(int64_t chunk = 256, int64_t batch = 1) {
  ServingLimits l;
  l.sequence_length = 256;
  l.batch_size = batch;
  l.chunk_size = chunk;
  l.threads = 2;
  return l;
}

TEST(Qwen35Config, ReadsTheTextConfigOfTheVisionLanguageWrapper) {
  ModelConfig c = load_model_config(shared_model("tiny-qwen35"));
  EXPECT_EQ(c.model_type, "qwen3_5");
  ASSERT_TRUE(c.is_hybrid());
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.num_hidden_layers, 8);
  for (int64_t l = 0; l < 8; ++l) EXPECT_EQ(c.is_linear_layer(l), (l + 1) % 4 != 0) << l;
  EXPECT_EQ(c.rotary_dim(), 16);
  EXPECT_EQ(c.rope_theta, 10000000.0);
  EXPECT_EQ(c.conv_dim(), 2 * 2 * 32 + 4 * 32);
  EXPECT_EQ(c.linear_value_dim(), 128);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.is_moe());

  ModelConfig moe = load_model_config(shared_model("tiny-qwen35-moe"));
  EXPECT_EQ(moe.model_type, "qwen3_5_moe");
  EXPECT_EQ(moe.num_experts, 8);
  EXPECT_EQ(moe.num_experts_per_tok, 2);
  EXPECT_EQ(moe.shared_expert_intermediate_size, 48);
  EXPECT_TRUE(moe.norm_topk_prob);  // always renormalised
  EXPECT_FALSE(moe.tie_word_embeddings);
}

// The text config of tiny-qwen35-moe, to be respelled.
nlohmann::json moe_text_config() {
  auto j = nlohmann::json::parse(test::read_text(shared_model("tiny-qwen35-moe") + "/config.json"));
  return j["text_config"];
}

TEST(Qwen35Config, AcceptsTheFlatTextConfigAndEverySpellingOfLayersAndRope) {
  nlohmann::json flat = moe_text_config();
  flat["architectures"] = {"Qwen3_5MoeForCausalLM"};
  flat.erase("layer_types");  // full_attention_interval 4 alone
  flat.erase("rope_parameters");
  flat.erase("partial_rotary_factor");
  flat["rope_theta"] = 5000000;
  flat["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {3, 3, 2}}};
  flat["partial_rotary_factor"] = 0.5;
  ModelConfig c = parse_model_config(flat.dump(), "config.json");
  EXPECT_EQ(c.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c.rope_theta, 5000000.0);
  EXPECT_EQ(c.rotary_dim(), 32);
  ASSERT_EQ(c.linear_attention.size(), 4u);
  EXPECT_TRUE(c.is_linear_layer(0) && c.is_linear_layer(2) && !c.is_linear_layer(3));

  flat["full_attention_interval"] = 2;
  c = parse_model_config(flat.dump(), "config.json");
  EXPECT_TRUE(c.is_linear_layer(0) && !c.is_linear_layer(1) && c.is_linear_layer(2));
}

TEST(Qwen35Config, BadConfigsGetOneLineNamingTheProblem) {
  nlohmann::json j = moe_text_config();
  j["layer_types"].erase(0);
  EXPECT_EQ(error_of([&] { parse_model_config(j.dump(), "c.json"); }),
            "c.json: field 'layer_types' lists 3 layers but num_hidden_layers is 4");

  nlohmann::json other = {{"architectures", {"MambaForCausalLM"}}, {"model_type", "mamba2"}};
  EXPECT_EQ(error_of([&] { parse_model_config(other.dump(), "c.json"); }),
            "c.json: unsupported model_type 'mamba2' (ellm loads qwen3, qwen3_moe, qwen3_5, "
            "qwen3_5_moe, qwen3_5_moe_text, qwen4_exp and qwen3_8_flash_next)");

  nlohmann::json wrapper = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
                            {"model_type", "qwen3_5"}};
  EXPECT_EQ(error_of([&] { parse_model_config(wrapper.dump(), "c.json"); }),
            "c.json: model_type 'qwen3_5' needs a 'text_config' object");
}

// Rewrites a shared model's checkpoint into dir as one file: `edit` may drop a tensor (return
// false), change its shape (its bytes become zeros) or add tensors through `extra`.
struct Rewrite {
  std::function<bool(TensorSpec&)> edit = [](TensorSpec&) { return true; };
  std::vector<TensorSpec> extra;
  std::function<void(const TensorSpec&, int64_t first, int64_t count, uint8_t* out)> fill_extra;
};

void rewrite_checkpoint(const std::string& from, const std::string& dir, const Rewrite& rw) {
  SafetensorsStore store = SafetensorsStore::open(from);
  std::vector<TensorSpec> specs;
  std::vector<const TensorInfo*> sources;
  for (const auto& [name, t] : store.tensors()) {
    TensorSpec spec{name, t.shape, t.dtype_name};
    if (!rw.edit(spec)) continue;
    specs.push_back(spec);
    sources.push_back(spec.shape == t.shape ? &t : nullptr);
  }
  for (const TensorSpec& spec : rw.extra) {
    specs.push_back(spec);
    sources.push_back(nullptr);
  }
  const size_t n_edited = specs.size() - rw.extra.size();
  std::vector<size_t> ids(specs.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  test::write_text(dir + "/config.json", test::read_text(from + "/config.json"));
  write_safetensors_bytes(dir + "/model.safetensors", specs, ids,
                          [&](size_t i, int64_t first, int64_t count, uint8_t* out) {
                            const size_t size = dtype_size(specs[i].dtype);
                            if (sources[i])
                              std::memcpy(out, sources[i]->data + first * size, count * size);
                            else if (i >= n_edited)
                              rw.fill_extra(specs[i], first, count, out);
                            else
                              std::memset(out, 0, count * size);
                          });
}

TEST(Qwen35Load, MissingALogAndMisShapedConvGetClearErrors) {
  const std::string name = "model.language_model.layers.1.linear_attn.";
  {
    test::ScratchDir dir;
    Rewrite rw;
    rw.edit = [&](TensorSpec& s) { return s.name != name + "A_log"; };
    rewrite_checkpoint(shared_model("tiny-qwen35"), dir.path, rw);
    EXPECT_EQ(load_error(dir.path, qwen35_limits()),
              dir / "model.safetensors" + ": missing tensor '" + name + "A_log'");
  }
  {
    test::ScratchDir dir;
    Rewrite rw;
    rw.edit = [&](TensorSpec& s) {
      if (s.name == name + "conv1d.weight") s.shape = {256, 3};
      return true;
    };
    rewrite_checkpoint(shared_model("tiny-qwen35"), dir.path, rw);
    EXPECT_EQ(load_error(dir.path, qwen35_limits()), dir / "model.safetensors" + ": tensor '" + name +
                                        "conv1d.weight' has shape [256, 3], expected [256, 1, 4] "
                                        "from config.json");
  }
}

// Feeds `chunks` (lengths) of `tokens` into slot 0; [tokens][vocab] logits.
std::vector<float> feed(Model& model, const std::vector<int32_t>& tokens,
                        const std::vector<int64_t>& chunks) {
  const int64_t V = model.vocab_size();
  std::vector<float> logits(tokens.size() * size_t(V));
  std::vector<BatchToken> batch;
  int64_t at = 0;
  for (size_t c = 0; at < int64_t(tokens.size()); ++c) {
    const int64_t len = std::min<int64_t>(c < chunks.size() ? chunks[c] : 1, int64_t(tokens.size()) - at);
    batch.clear();
    for (int64_t i = at; i < at + len; ++i) batch.push_back({tokens[i], 0, int32_t(i), true});
    model.forward(batch, logits.data() + at * V);
    at += len;
  }
  return logits;
}

std::vector<int32_t> golden_tokens(const std::string& name) {
  auto session = nlohmann::json::parse(
      test::read_text(test::shared_dir() + "/golden/" + name + "/session.json"));
  return session["tokens"].get<std::vector<int32_t>>();
}

// Per position, the largest |difference| of two runs' logits.
std::vector<double> position_diffs(const std::vector<float>& a, const std::vector<float>& b,
                                   int64_t V) {
  std::vector<double> err(a.size() / size_t(V), 0.0);
  for (size_t p = 0; p < err.size(); ++p)
    for (int64_t v = 0; v < V; ++v)
      err[p] = std::max(err[p], double(std::fabs(a[p * V + v] - b[p * V + v])));
  return err;
}

// The chunked delta rule over a whole prompt, chunks that cut its 64-token chunks anywhere, and
// the recurrence token by token give the same logits on every tier, within the golden rule
// (atol at >= 90% of positions; golden_test.cc expect_same_logits says why not to the bit).
// Fed with the same cuts, they are the same bits.
TEST(Qwen35Forward, AnyChunkingGivesTheSameLogitsOnEveryTier) {
  for (const std::string name : {"tiny-qwen35", "tiny-qwen35-moe"}) {
    const std::vector<int32_t> tokens = golden_tokens(name);
    ASSERT_EQ(tokens.size(), 245u);
    auto session = nlohmann::json::parse(
        test::read_text(test::shared_dir() + "/golden/" + name + "/session.json"));
    const double atol = session["atol"];
    const Isa saved = active_isa();
    for (Isa isa : test::tiers_under_test()) {
      set_active_isa(isa);
      auto model = Model::load(shared_model(name), qwen35_limits());
      const int64_t V = model->vocab_size();
      std::vector<float> at_once = feed(*model, tokens, {245});
      // Token by token over the first 96 positions only (past the first chunk of 64): each
      // single-token pass costs as much as a chunk, and under ASan the whole session took minutes.
      const std::vector<int32_t> head(tokens.begin(), tokens.begin() + 96);
      for (const std::vector<int64_t>& cuts :
           {std::vector<int64_t>{1, 63, 2, 64, 65, 50}, std::vector<int64_t>{}}) {
        const std::vector<float> other = feed(*model, cuts.empty() ? head : tokens, cuts);
        std::vector<double> err = position_diffs(std::vector<float>(at_once.begin(), at_once.begin() + other.size()), other, V);
        std::vector<double> sorted = err;
        std::sort(sorted.begin(), sorted.end());
        const size_t p90 = sorted.size() * 9 / 10;
        std::printf("[%s %s] at once vs %s: |diff| p50 %.3f p90 %.3f max %.3f\n", name.c_str(),
                    isa_name(isa), cuts.empty() ? "token by token" : "chunked", sorted[sorted.size() / 2],
                    sorted[p90], sorted.back());
        EXPECT_LE(sorted[p90], atol) << isa_name(isa);
        EXPECT_EQ(err[0], 0.0) << "the first token: the same arithmetic";
      }
      EXPECT_EQ(feed(*model, tokens, {245}), at_once) << "a pass must not depend on the last one";
    }
    set_active_isa(saved);
  }
}

TEST(Qwen35Forward, ReportsStateAndKvSizes) {
  auto model = Model::load(shared_model("tiny-qwen35"), qwen35_limits(256, 2));
  EXPECT_TRUE(model->has_recurrent_state());
  // 6 GDN layers x (conv window 3 x 256 + S 4 x 32 x 32) FP32; KV: 2 full layers x K, V x 2 x 64 FP16.
  EXPECT_EQ(model->state_bytes_per_slot(), size_t(6 * (3 * 256 + 4 * 32 * 32) * 4));
  EXPECT_EQ(model->kv_bytes_per_token(), size_t(2 * 2 * 2 * 64 * 2));
  ServingLimits tight = qwen35_limits(256, 2);
  tight.kv_memory_bytes = 200000;  // less than 2 slots' state
  EXPECT_NE(error_of([&] { Model::load(shared_model("tiny-qwen35"), tight); })
                .find("cannot hold the recurrent state of 2 slots"),
            std::string::npos);
}

// A slot's KV alone cannot resume a sequence: the model refuses to continue a slot anywhere but
// where its state ends, and starting over at 0 resets the state.
TEST(Qwen35Forward, ASlotResumesOnlyWithItsState) {
  auto model = Model::load(shared_model("tiny-qwen35"), qwen35_limits());
  const std::vector<int32_t> tokens = golden_tokens("tiny-qwen35");
  const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + 10);
  std::vector<float> first = feed(*model, prefix, {10});
  std::vector<float> logits(size_t(model->vocab_size()));
  auto step = [&](int32_t position) {
    std::vector<BatchToken> t = {{tokens[position], 0, position, true}};
    model->forward(t, logits.data());
  };
  EXPECT_NE(error_of([&] { step(5); }).find("its recurrent state ends at 10"), std::string::npos);
  EXPECT_NE(error_of([&] { step(11); }).find("its recurrent state ends at 10"), std::string::npos);
  EXPECT_EQ(error_of([&] { step(10); }), "");
  model->release_kv(0, 4);
  EXPECT_NE(error_of([&] { step(4); }).find("is not valid"), std::string::npos);
  // Starting over gives the first pass's logits again, bit for bit.
  EXPECT_EQ(feed(*model, prefix, {10}), first);
  std::vector<std::span<uint8_t>> ranges;
  model->kv_ranges(0, 0, 10, /*for_write=*/true, ranges);
  EXPECT_NE(error_of([&] { step(10); }).find("is not valid"), std::string::npos);
  // Its state written for a restore: not valid until the restore names the position it holds.
  model->set_state_end(0, 10);
  EXPECT_EQ(error_of([&] { step(10); }), "");
  ranges.clear();
  model->state_ranges(0, /*for_write=*/true, ranges);
  EXPECT_EQ(ranges.size(), 6u) << "one range per Gated DeltaNet layer";
  EXPECT_NE(error_of([&] { step(11); }).find("is not valid"), std::string::npos);
}

// Snapshots (sessions of hybrid models): a pass copies a slot's state after a token it marks,
// splitting that slot's delta-rule chunks there. The copy is the state a pass ending there
// leaves, bit for bit; the marked pass's logits are those of two passes split there; and that
// copy with the KV rows below it resumes another slot exactly where the first one was.
TEST(Qwen35Snapshots, ACapturedStateResumesAnotherSlotBitForBit) {
  for (const std::string name : {"tiny-qwen35", "tiny-qwen35-moe"}) {
    const std::vector<int32_t> all = golden_tokens(name);
    const std::vector<int32_t> tokens(all.begin(), all.begin() + 100);
    const int32_t at = 70;  // the snapshot holds the state after tokens [0, 70), past a chunk of 64
    const Isa saved = active_isa();
    for (Isa isa : test::tiers_under_test()) {
      SCOPED_TRACE(name + " " + isa_name(isa));
      set_active_isa(isa);
      auto model = Model::load(shared_model(name), qwen35_limits(256, 2));
      const int64_t V = model->vocab_size();
      std::vector<uint8_t> snapshot(model->state_bytes_per_slot(), 0xee);
      auto batch_of = [&](int slot, int32_t begin, int32_t end) {
        std::vector<BatchToken> batch;
        for (int32_t p = begin; p < end; ++p) batch.push_back({tokens[p], slot, p, true});
        return batch;
      };
      // Slot 0: one pass over all 100, capturing after token 69.
      std::vector<BatchToken> marked = batch_of(0, 0, 100);
      marked[at - 1].snapshot = snapshot.data();
      std::vector<float> one_pass(100 * size_t(V));
      model->forward(marked, one_pass.data());
      // Slot 1: two passes split there; the state between them is the snapshot.
      std::vector<float> split(100 * size_t(V));
      model->forward(batch_of(1, 0, at), split.data());
      std::vector<std::span<uint8_t>> state;
      model->state_ranges(1, false, state);
      std::vector<uint8_t> between;
      for (auto range : state) between.insert(between.end(), range.begin(), range.end());
      EXPECT_EQ(between, snapshot) << "the captured state is the state of a pass ending there";
      model->forward(batch_of(1, at, 100), split.data() + at * V);
      EXPECT_EQ(one_pass, split) << "a capture splits the pass exactly as two passes do";

      // Slot 1 from slot 0's KV rows below 70 and the snapshot: the rest as slot 0 had it.
      model->release_kv(1, 0);
      test::resume_from_copy(*model, 0, 1, at, snapshot);
      EXPECT_EQ(model->state_end(1), at);
      std::vector<float> resumed((100 - at) * size_t(V));
      model->forward(batch_of(1, at, 100), resumed.data());
      EXPECT_TRUE(std::equal(resumed.begin(), resumed.end(), one_pass.begin() + at * V))
          << "resumed from the snapshot: the same bits as the pass it was taken in";
      EXPECT_EQ(model->state_end(1), 100);
    }
    set_active_isa(saved);
  }
  // A model without a recurrent state has none to capture.
  auto dense = Model::load(shared_model("tiny-qwen3"), qwen35_limits());
  uint8_t byte = 0;
  std::vector<BatchToken> batch = {{1, 0, 0, true, false, &byte}};
  std::vector<float> logits(size_t(dense->vocab_size()));
  EXPECT_NE(error_of([&] { dense->forward(batch, logits.data()); }).find("has none"), std::string::npos);
}

// tiny-qwen35-moe with its fused experts split into one tensor per expert (the FP8 checkpoints'
// layout) gives the same logits bit for bit.
TEST(Qwen35Load, FusedAndPerExpertLayoutsGiveTheSameModel) {
  const std::string from = shared_model("tiny-qwen35-moe");
  ModelConfig c = load_model_config(from);
  const int64_t E = c.num_experts, F = c.moe_intermediate_size, H = c.hidden_size;
  SafetensorsStore store = SafetensorsStore::open(from);
  Rewrite rw;
  rw.edit = [](TensorSpec& s) { return s.name.find("mlp.experts.") == std::string::npos; };
  struct Source {
    const TensorInfo* fused;
    int64_t offset;  // elements
  };
  std::vector<Source> sources;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.language_model.layers." + std::to_string(l) + ".mlp.experts.";
    const TensorInfo& gate_up = store.get(p + "gate_up_proj");
    const TensorInfo& down = store.get(p + "down_proj");
    for (int64_t e = 0; e < E; ++e) {
      const std::string q = p + std::to_string(e) + ".";
      rw.extra.push_back({q + "gate_proj.weight", {F, H}, gate_up.dtype_name});
      sources.push_back({&gate_up, e * 2 * F * H});
      rw.extra.push_back({q + "up_proj.weight", {F, H}, gate_up.dtype_name});
      sources.push_back({&gate_up, e * 2 * F * H + F * H});
      rw.extra.push_back({q + "down_proj.weight", {H, F}, down.dtype_name});
      sources.push_back({&down, e * H * F});
    }
  }
  rw.fill_extra = [&](const TensorSpec& spec, int64_t first, int64_t count, uint8_t* out) {
    size_t i = size_t(std::find_if(rw.extra.begin(), rw.extra.end(),
                                   [&](const TensorSpec& s) { return s.name == spec.name; }) -
                      rw.extra.begin());
    const size_t size = dtype_size(spec.dtype);
    std::memcpy(out, sources[i].fused->data + (sources[i].offset + first) * size, count * size);
  };
  test::ScratchDir dir;
  rewrite_checkpoint(from, dir.path, rw);
  const std::vector<int32_t> tokens = golden_tokens("tiny-qwen35-moe");
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 70);
  auto fused = Model::load(from, qwen35_limits());
  auto per_expert = Model::load(dir.path, qwen35_limits());
  EXPECT_EQ(feed(*fused, prompt, {70}), feed(*per_expert, prompt, {70}));
}

}  // namespace
}  // namespace ellm
