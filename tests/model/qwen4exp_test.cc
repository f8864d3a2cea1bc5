// Qwen3.8-Flash-Next (tiny-qwen4exp) against its golden session, fed as the feeds list and as
// one prompt at once, on every tier; and the load errors of its config and checkpoint. The
// parameterised golden tests (golden_test.cc) cover it too: chunks, parts, batches, snapshots.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "base/cpu.h"
#include "golden_util.h"
#include "model/config.h"
#include "model/blocks/ngram_embedding.h"
#include "model/model.h"
#include "model_test_util.h"
#include "tiers_under_test.h"

namespace ellm {
namespace {

const char kModel[] = "tiny-qwen4exp";

ServingLimits qwen4exp_limits(int64_t chunk = 256) {
  ServingLimits l;
  l.sequence_length = 256;
  l.chunk_size = chunk;
  l.threads = 2;
  l.activations = ActivationDtype::bf16;
  return l;
}

std::vector<float> feed(Model& model, const std::vector<std::vector<int32_t>>& chunks) {
  const int64_t V = model.vocab_size();
  std::vector<float> logits;
  int32_t position = 0;
  for (const auto& chunk : chunks) {
    std::vector<BatchToken> batch;
    for (int32_t id : chunk) batch.push_back({id, 0, position++, true});
    logits.resize(logits.size() + chunk.size() * size_t(V));
    model.forward(batch, logits.data() + logits.size() - chunk.size() * size_t(V));
  }
  return logits;
}

class Qwen4Exp : public testing::Test {
 protected:
  void SetUp() override { isa_ = active_isa(); }
  void TearDown() override { set_active_isa(isa_); }

 private:
  Isa isa_ = Isa::scalar;
};

// The golden rule on every tier, for the session fed as its feeds (a prefill, decode steps, a
// chunk, decode steps) and for all of it fed as one prompt.
TEST_F(Qwen4Exp, GoldenSessionPassesOnEveryTier) {
  test::Golden golden(kModel);
  const double atol = golden.session["atol"];
  std::vector<int32_t> all;
  for (const auto& f : golden.feeds) all.insert(all.end(), f.begin(), f.end());
  for (Isa isa : test::tiers_under_test()) {
    set_active_isa(isa);
    auto model = Model::load(test::shared_model(kModel), qwen4exp_limits());
    const std::vector<std::vector<int32_t>> at_once = {all};
    for (const auto& [what, chunks] : {std::pair{"feeds", golden.feeds}, std::pair{"at once", at_once}}) {
      const test::Score s = test::score(golden, feed(*model, chunks));
      std::printf("[%s %s, %s] err p50 %.4f p90 %.4f max %.4f (atol %.2f), %.1f%% within atol, "
                  "max |dlogit| %.4f, %d clear-margin argmax changed\n",
                  kModel, isa_name(isa), what, s.percentile(0.5), s.percentile(0.9), s.percentile(1.0),
                  atol, 100 * s.fraction_within, s.max_dlogit, s.clear_margin_mismatches);
      std::string over;  // the positions beyond atol, * where the golden lists a QSA near-tie
      const auto& ties = golden.session["qsa_near_tie_positions"];
      for (size_t p = 0; p < s.err.size(); ++p)
        if (s.err[p] > atol)
          over += " " + std::to_string(p) + (std::find(ties.begin(), ties.end(), int(p)) != ties.end() ? "*" : "");
      std::printf("  positions beyond atol:%s\n", over.c_str());
      EXPECT_GE(s.fraction_within, 0.9) << isa_name(isa) << " " << what;
      EXPECT_EQ(s.argmax_mismatches, 0) << isa_name(isa) << " " << what;
    }
  }
}

// The hash constants of the real model's config (vocab 248320, seed 1234, one module of 16
// heads over a base of 20,000,000 padded to 128): the note's multipliers, sizes and rows.
TEST_F(Qwen4Exp, HashConstantsOfTheRealConfig) {
  NgramEmbeddingSpec spec;
  spec.ngram_size = 3;
  spec.heads_per_ngram = 8;
  spec.embed_dim = 2560;
  spec.vocab = 248320;
  spec.table_base = 20000000;
  spec.table_divisor = 128;
  spec.seed = 1234;
  const NgramHash h = ngram_hash(spec);
  EXPECT_EQ(h.multipliers, (std::vector<int64_t>{23703573157769, 20109073645365, 8052911324071}));
  ASSERT_EQ(h.sizes.size(), 16u);
  EXPECT_EQ(h.sizes.front(), 20000003);
  EXPECT_EQ(h.sizes.back(), 20000171);
  EXPECT_EQ(h.offsets[1], 20000003);
  EXPECT_EQ(h.offsets.back() + h.sizes.back(), 320001446);
  EXPECT_EQ(h.rows, 320001536);
}

// A copy of the model folder with config.json edited (the checkpoint linked).
struct EditedModel {
  test::ScratchDir dir;
  explicit EditedModel(const std::function<void(nlohmann::json& text)>& edit) {
    const std::string from = test::shared_model(kModel);
    nlohmann::json config = nlohmann::json::parse(test::read_text(from + "/config.json"));
    edit(config["text_config"]);
    test::write_text(dir / "config.json", config.dump(2));
    std::filesystem::create_symlink(from + "/model.safetensors", dir / "model.safetensors");
  }
  std::string load_error() const {
    return test::error_of([&] { Model::load(dir.path, qwen4exp_limits()); });
  }
};

TEST_F(Qwen4Exp, LoadErrorsAreOneLine) {
  auto expect = [](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  };
  expect(EditedModel([](nlohmann::json& t) { t["layer_types"].erase(0); }).load_error(),
         "field 'layer_types' lists 7 layers but num_hidden_layers is 8");
  expect(EditedModel([](nlohmann::json& t) { t["seed"] = 4321; }).load_error(),
         "the n-gram hash constant 'model.language_model.layers.1.ple.ple_embedding.layer_multipliers'");
  expect(EditedModel([](nlohmann::json& t) { t["ngram_vocab_size_base"] = 2000; }).load_error(),
         "ngram_heads_vocab_sizes");
  expect(EditedModel([](nlohmann::json& t) { t["split_ngram_parts"] = 5; }).load_error(),
         "missing n-gram table shard");
  expect(EditedModel([](nlohmann::json& t) { t["make_ngram_vocab_size_divisible_by"] = 1; }).load_error(),
         "shards hold 4096 rows, but the config gives 4062");
  expect(EditedModel([](nlohmann::json& t) { t["ple_layer_ids"] = nlohmann::json::array({0}); }).load_error(),
         "they count from 1");
}

// The n-gram table stays in the checkpoint's mapping: its size is the shards' bytes, each token
// gathered is counted with its page faults, a table dropped from memory reads back the same
// rows, and --mlock-table pins it whole (or says why it cannot).
TEST_F(Qwen4Exp, TableIsReadInPlaceCountedEvictedAndPinned) {
  test::Golden golden(kModel);
  const std::vector<std::vector<int32_t>> prompt = {golden.feeds.front()};
  ASSERT_GE(prompt.front().size(), 16u);  // a prompt's rows are read ahead and gathered in parallel
  auto model = Model::load(test::shared_model(kModel), qwen4exp_limits());
  const MappedTableStatus loaded = model->mapped_table();
  const nlohmann::json config = nlohmann::json::parse(test::read_text(test::shared_model(kModel) + "/config.json"));
  const nlohmann::json& text = config["text_config"];
  const size_t heads = (text["ngram_size"].get<size_t>() - 1) * text["heads_per_ngram"].get<size_t>();
  EXPECT_EQ(loaded.bytes, size_t(4096) * (text["ple_embed_dim"].get<size_t>() / heads) * 2);  // 4096 BF16 rows
  EXPECT_EQ(loaded.gathered_tokens, 0u);
  EXPECT_FALSE(loaded.locked);

  const std::vector<float> warm = feed(*model, prompt);
  const MappedTableStatus after = model->mapped_table();
  EXPECT_EQ(after.gathered_tokens, prompt.front().size());
  EXPECT_GT(after.resident_bytes, 0u);
  EXPECT_LE(after.resident_bytes, after.bytes);

  const ServingLimits one_slot = qwen4exp_limits();
  auto fresh = Model::load(test::shared_model(kModel), one_slot);
  fresh->evict_mapped_table();
  EXPECT_EQ(feed(*fresh, prompt), warm) << "rows read back after an eviction differ";
  const std::vector<std::vector<int32_t>> one_by_one = [&] {
    std::vector<std::vector<int32_t>> steps;
    for (int32_t id : prompt.front()) steps.push_back({id});
    return steps;
  }();
  auto stepped = Model::load(test::shared_model(kModel), one_slot);
  feed(*stepped, one_by_one);  // decode's path: gathered on the calling thread, no read-ahead
  EXPECT_EQ(stepped->mapped_table().gathered_tokens, prompt.front().size());

  ServingLimits pinned = qwen4exp_limits();
  pinned.lock_mapped_table = true;
  try {
    auto locked = Model::load(test::shared_model(kModel), pinned);
    const MappedTableStatus s = locked->mapped_table();
    EXPECT_TRUE(s.locked);
    EXPECT_EQ(s.resident_bytes, s.bytes);
  } catch (const Error& e) {  // a locked-memory limit too small for the table
    const std::string message = e.what();
    EXPECT_NE(message.find("--mlock-table"), std::string::npos) << message;
    EXPECT_NE(message.find("ulimit -l"), std::string::npos) << message;
  }
}

// Both model_type names load; groups of more than 15 speculative tokens are refused, as for
// Qwen3.5 (speculative_test.cc checks the rollback).
TEST_F(Qwen4Exp, ModelTypesAndSpeculativeTokens) {
  test::ScratchDir dir;
  const std::string from = test::shared_model(kModel);
  nlohmann::json config = nlohmann::json::parse(test::read_text(from + "/config.json"));
  config["model_type"] = "qwen3_8_flash_next";
  test::write_text(dir / "config.json", config.dump(2));
  std::filesystem::create_symlink(from + "/model.safetensors", dir / "model.safetensors");
  auto model = Model::load(dir.path, qwen4exp_limits());
  EXPECT_TRUE(model->has_recurrent_state());
  EXPECT_NE(model->kv_format().find("qwen4exp-kv"), std::string::npos);
  ServingLimits speculative = qwen4exp_limits();
  speculative.speculative_tokens = 16;
  EXPECT_NE(test::error_of([&] { Model::load(from, speculative); }).find("at most 15"), std::string::npos);
  speculative.speculative_tokens = 4;
  EXPECT_NO_THROW(Model::load(from, speculative));
}

// Three slots decode past the indexer's budget in one step: each row gives the bits it gives
// decoded alone, with 4 threads (fewer rows than threads: each row's blocks and its attention
// split among the threads) and with 2 (each thread its rows), on every tier.
TEST_F(Qwen4Exp, DecodeRowsOfABatchAreEachRowAlone) {
  const std::string from = test::shared_model(kModel);
  constexpr int kSlots = 3;
  constexpr int32_t kPrompt = 70;
  auto decode = [&](int threads, bool together) {
    ServingLimits l = qwen4exp_limits();
    l.threads = threads;
    l.batch_size = kSlots;
    auto model = Model::load(from, l);
    const int64_t V = model->vocab_size();
    std::vector<float> logits(size_t(kSlots * V));
    for (int slot = 0; slot < kSlots; ++slot) {
      std::vector<BatchToken> prompt;
      for (int32_t p = 0; p < kPrompt; ++p) prompt.push_back({(p * 7919 + slot * 104729) % 150000, slot, p, false});
      model->forward(prompt, nullptr);
    }
    std::vector<BatchToken> step;
    for (int slot = 0; slot < kSlots; ++slot) step.push_back({1000 + slot, slot, kPrompt, true});
    if (together) {
      model->forward(step, logits.data());
    } else {
      for (int slot = 0; slot < kSlots; ++slot) model->forward({&step[size_t(slot)], 1}, logits.data() + slot * V);
    }
    return logits;
  };
  for (Isa isa : test::tiers_under_test()) {
    set_active_isa(isa);
    const std::vector<float> alone = decode(4, false);
    EXPECT_EQ(alone, decode(4, true)) << isa_name(isa) << ": 4 threads";
    EXPECT_EQ(alone, decode(2, true)) << isa_name(isa) << ": 2 threads";
  }
}

}  // namespace
}  // namespace ellm
