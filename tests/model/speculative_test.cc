// Speculative groups (Model::accept): the rows of a group of tokens checked at once are the bits
// decode steps give for the same tokens, on every shared model and tier, and a group cut short
// leaves the slot (KV and a hybrid model's recurrent state) exactly as if only its kept tokens
// had been fed.
#include <gtest/gtest.h>

#include <cstring>

#include "base/cpu.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model_test_util.h"
#include "tiers_under_test.h"

namespace ellm {
namespace {

using test::error_of;

const std::vector<std::string> kModels = {"tiny-qwen3",      "tiny-qwen3-moe", "tiny-qwen3-fp8",
                                          "tiny-qwen3-moe-fp8", "tiny-qwen3-gptq", "tiny-qwen3-awq",
                                          "tiny-qwen35",     "tiny-qwen35-moe", "tiny-qwen4exp"};

using test::shared_model;

ServingLimits spec_limits(int64_t speculative_tokens = 4, bool bf16_attention = false) {
  ServingLimits l;
  l.attention_bf16_products = bf16_attention;
  l.sequence_length = 64;
  l.batch_size = 2;
  l.threads = 2;
  l.speculative_tokens = speculative_tokens;
  return l;
}

std::vector<int32_t> prompt() {
  std::vector<int32_t> p;
  for (int i = 0; i < 24; ++i) p.push_back(1000 + (i * 7919) % 20000);
  return p;
}

int32_t best(const float* row, int64_t V) { return int32_t(std::max_element(row, row + V) - row); }

// Feeds tokens at consecutive positions from `position` into `slot`, every one wanting logits.
std::vector<float> feed(Model& model, int slot, int32_t position, const std::vector<int32_t>& tokens,
                        bool speculative) {
  std::vector<BatchToken> batch;
  for (size_t i = 0; i < tokens.size(); ++i)
    batch.push_back({tokens[i], slot, position + int32_t(i), true, speculative});
  std::vector<float> logits(tokens.size() * size_t(model.vocab_size()));
  model.forward(batch, logits.data());
  return logits;
}

// Rows [b_row, b_row + n) of `b` are rows [a_row, a_row + n) of `a`, bit for bit.
void expect_rows(const std::vector<float>& a, size_t a_row, const std::vector<float>& b, size_t b_row,
                 size_t n, int64_t V, const std::string& what) {
  for (size_t r = 0; r < n; ++r) {
    const float* x = a.data() + (a_row + r) * V;
    const float* y = b.data() + (b_row + r) * V;
    double worst = 0;
    for (int64_t v = 0; v < V; ++v) worst = std::max(worst, double(std::abs(x[v] - y[v])));
    EXPECT_TRUE(std::memcmp(x, y, size_t(V) * sizeof(float)) == 0)
        << what << " row " << r << ": max |diff| " << worst;
  }
}

class Speculative : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { isa_ = active_isa(); }
  void TearDown() override { set_active_isa(isa_); }

 private:
  Isa isa_ = Isa::scalar;
};

// Also with attention on BF16 products where the tier has them (--attention-products bf16).
TEST_P(Speculative, GroupsGiveDecodeRowsAndRollBackExactly) {
  for (Isa isa : test::tiers_under_test())
  for (bool bf16_attention : {false, true}) {
    set_active_isa(isa);
    if (bf16_attention && !has_bf16_attention_products()) continue;
    const std::string what = GetParam() + " " + isa_name(isa) + (bf16_attention ? " bf16 attention" : "");
    auto model = Model::load(shared_model(GetParam()), spec_limits(4, bf16_attention));
    const int64_t V = model->vocab_size();
    const std::vector<int32_t> p = prompt();
    const int32_t P = int32_t(p.size());

    // Plain greedy decoding in slot 0: rows[i] is position P - 1 + i's, choosing tokens[i].
    std::vector<float> rows = feed(*model, 0, 0, p, false);
    rows.erase(rows.begin(), rows.begin() + (P - 1) * V);
    std::vector<int32_t> tokens = {best(rows.data(), V)};
    for (int i = 0; i < 10; ++i) {
      std::vector<float> step = feed(*model, 0, P + i, {tokens.back()}, false);
      rows.insert(rows.end(), step.begin(), step.end());
      tokens.push_back(best(step.data(), V));
    }

    // Slot 1: the same prompt, then groups checked at once.
    feed(*model, 1, 0, p, false);
    // All four right: rows 0..3 equal decode's.
    std::vector<float> g = feed(*model, 1, P, {tokens[0], tokens[1], tokens[2], tokens[3]}, true);
    expect_rows(rows, 1, g, 0, 4, V, what + " group of 4");
    model->accept(1, P + 4);
    // Two right, then two wrong: keep the two; the wrong ones must leave no trace.
    g = feed(*model, 1, P + 4, {tokens[4], tokens[5], 17, 4242}, true);
    expect_rows(rows, 5, g, 0, 2, V, what + " cut group");
    model->accept(1, P + 6);
    g = feed(*model, 1, P + 6, {tokens[6], tokens[7], tokens[8]}, true);
    expect_rows(rows, 7, g, 0, 3, V, what + " group after a rollback");
    // Only the next token kept: the whole group but its first is dropped.
    model->accept(1, P + 7);
    g = feed(*model, 1, P + 7, {tokens[7]}, false);
    expect_rows(rows, 8, g, 0, 1, V, what + " decode after keeping one");
    g = feed(*model, 1, P + 8, {tokens[8], tokens[9]}, true);
    expect_rows(rows, 9, g, 0, 2, V, what + " last group");
    model->accept(1, P + 10);
  }
}

INSTANTIATE_TEST_SUITE_P(SharedModels, Speculative, testing::ValuesIn(kModels),
                         test::ModelTestName());

TEST(SpeculativeGroups, TheRulesOfAcceptAreChecked) {
  auto model = Model::load(shared_model("tiny-qwen35"), spec_limits(2));
  std::vector<float> logits(8 * size_t(model->vocab_size()));
  std::vector<BatchToken> batch = {{5, 0, 0, true}, {6, 0, 1, true}};
  model->forward(batch, logits.data());
  batch = {{7, 0, 2, true, true}, {8, 0, 3, true, true}};
  model->forward(batch, logits.data());
  std::vector<BatchToken> plain = {{9, 0, 4, true}};
  EXPECT_EQ(error_of([&] { model->forward(plain, logits.data()); }),
            "forward: slot 0 has speculative tokens waiting for accept()");
  EXPECT_EQ(error_of([&] { model->accept(0, 5); }),
            "accept: slot 0: position 5 is outside its speculative tokens [2, 4]");
  std::vector<BatchToken> too_many = {{9, 0, 4, true, true}, {9, 0, 5, true, true}};
  EXPECT_EQ(error_of([&] { model->forward(too_many, logits.data()); }),
            "forward: slot 0: more than 3 speculative tokens before accept() (speculative_tokens + 1)");
  model->accept(0, 3);
  // Kept up to 3: the slot continues there, and nowhere else.
  EXPECT_NE(error_of([&] { model->forward(plain, logits.data()); }), "");
  plain = {{9, 0, 3, true}};
  model->forward(plain, logits.data());
  std::vector<BatchToken> mixed = {{1, 0, 4, true}, {2, 0, 5, true, true}};
  EXPECT_EQ(error_of([&] { model->forward(mixed, logits.data()); }),
            "forward: slot 0: speculative tokens must come before its plain ones in a pass");

  auto plain_model = Model::load(shared_model("tiny-qwen3"), spec_limits(0));
  EXPECT_EQ(error_of([&] { plain_model->forward(batch, logits.data()); }),
            "forward: speculative tokens, but the model was loaded with speculative_tokens = 0");
  ServingLimits hybrid_limits = spec_limits(16);
  EXPECT_EQ(error_of([&] { Model::load(shared_model("tiny-qwen35"), hybrid_limits); }),
            "--num-speculative-tokens: a hybrid model checks at most 15 proposed tokens at once");
}

}  // namespace
}  // namespace ellm
