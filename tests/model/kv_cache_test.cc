#include "model/kv_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "base/memory.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model_test_util.h"

namespace ellm {
namespace {

constexpr int64_t kMillion = 1 << 20;

// Writes K and V of positions [begin, end) of a slot in every layer and head.
void write_positions(KvCache& kv, int64_t layers, int64_t slot, int64_t heads, int64_t head_dim,
                     int64_t begin, int64_t end, float value) {
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t p = begin; p < end; ++p)
        for (int64_t d = 0; d < head_dim; ++d) {
          kv.k(l, slot)[h * kv.head_stride() + p * head_dim + d] = value + float(p);
          kv.v(l, slot)[h * kv.head_stride() + p * head_dim + d] = -value - float(p);
        }
  kv.note_written(slot, end);
}

TEST(KvCache, MillionTokenReservationForQwen3_0_6BCommitsOnlyWhatIsWritten) {
  // Qwen3-0.6B: 28 layers, 8 KV heads, head_dim 128 -> 112 KiB per position, 224 GiB in all.
  const size_t rss_before = process_resident_bytes();
  KvCache kv(28, 1, 8, kMillion, 128);
  EXPECT_EQ(kv.reserved_bytes(), size_t(28) * 2 * 8 * kMillion * 128 * 4);
  EXPECT_GT(kv.reserved_bytes(), physical_memory_bytes());
  EXPECT_EQ(kv.bytes_per_token(), size_t(28) * 2 * 8 * 128 * 4);
  EXPECT_EQ(kv.resident_bytes(), 0u);

  write_positions(kv, 28, 0, 8, 128, 0, 1000, 1.0f);
  const size_t written = 1000 * kv.bytes_per_token();
  EXPECT_GE(kv.resident_bytes(), written);
  EXPECT_LE(kv.resident_bytes(), written + 28 * 2 * 8 * size_t(sysconf(_SC_PAGESIZE)));
  EXPECT_LT(process_resident_bytes(), rss_before + 2 * written);

  // The far end of the sequence works too, and costs only its own pages.
  write_positions(kv, 1, 0, 1, 128, kMillion - 8, kMillion, 5.0f);
  EXPECT_EQ(kv.k(0, 0)[(kMillion - 1) * 128], 5.0f + float(kMillion - 1));

  const size_t rss_full = process_resident_bytes();
  kv.release(0, 0);
  EXPECT_EQ(kv.resident_bytes(), 0u);
  EXPECT_LT(process_resident_bytes(), rss_full - written / 2);
  EXPECT_EQ(kv.k(3, 0)[5 * 128], 0.0f);  // released pages read as zero
}

TEST(KvCache, LayoutIsSlotHeadPositionContiguousAndReleaseKeepsThePrefix) {
  const int64_t layers = 2, slots = 3, heads = 2, positions = 4096, hd = 64;
  KvCache kv(layers, slots, heads, positions, hd);
  EXPECT_EQ(kv.head_stride(), positions * hd);
  EXPECT_EQ(kv.v(0, 0), kv.k(0, 0) + slots * heads * positions * hd);
  EXPECT_EQ(kv.k(0, 1), kv.k(0, 0) + heads * positions * hd);
  write_positions(kv, layers, 1, heads, hd, 0, 300, 10.0f);
  EXPECT_EQ(kv.k(1, 0)[0], 0.0f);  // other slots untouched
  EXPECT_EQ(kv.k(1, 2)[0], 0.0f);

  kv.release(1, 100);  // keep positions [0, 100)
  for (int64_t p = 0; p < 100; ++p) {
    EXPECT_EQ(kv.k(1, 1)[kv.head_stride() + p * hd + 3], 10.0f + float(p));
    EXPECT_EQ(kv.v(0, 1)[p * hd], -10.0f - float(p));
  }
  // Whole pages past the cut are gone: 64 floats = 256 B per position, 16 positions a page.
  EXPECT_EQ(kv.k(0, 1)[112 * hd], 0.0f);
  EXPECT_EQ(kv.v(1, 1)[kv.head_stride() + 299 * hd], 0.0f);
  EXPECT_LE(kv.resident_bytes(), size_t(layers * 2 * heads) * 112 * hd * 4);
}

TEST(KvCache, ModelWithMillionTokenSequenceStartsAndGrowsWithPositions) {
  // The per-layer shape of Qwen3-0.6B with fewer layers and a short vocabulary.
  ModelConfig config = preset_config("qwen3-0.6b");
  config.num_hidden_layers = 2;
  config.vocab_size = 1024;
  test::ScratchDir dir;
  write_random_model(config, dir.path, 7, 1);
  ServingLimits limits;
  limits.sequence_length = kMillion;
  limits.chunk_size = 64;
  limits.threads = 2;
  auto model = Model::load(dir.path, limits);
  EXPECT_EQ(model->kv_bytes_per_token(), size_t(2) * 2 * 8 * 128 * 4);
  EXPECT_LT(process_resident_bytes(), size_t(1) << 30);
  EXPECT_EQ(model->kv_resident_bytes(), 0u);

  std::vector<BatchToken> batch;
  for (int i = 0; i < 64; ++i) batch.push_back({i * 3, 0, i, i == 63});
  std::vector<float> logits(1024);
  model->forward(batch, logits.data());
  size_t resident = model->kv_resident_bytes();
  EXPECT_GE(resident, 64 * model->kv_bytes_per_token());
  EXPECT_LE(resident, 64 * model->kv_bytes_per_token() + 2 * 2 * 8 * 4096);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));

  model->release_kv(0, 0);
  EXPECT_EQ(model->kv_resident_bytes(), 0u);
}

}  // namespace
}  // namespace ellm
