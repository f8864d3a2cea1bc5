#include "model/memory/kv_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "base/memory.h"
#include "kernels/kv_rows.h"
#include "tools/make_model.h"
#include "model/model.h"
#include "model_test_util.h"

namespace ellm {
namespace {

constexpr int64_t kMillion = 1 << 20;
constexpr size_t kHuge = VirtualRegion::kHugePage;  // a slot's range commits in these at most

// An FP16 cache's K and V of a layer and slot as elements.
f16* k16(const KvCache& kv, int64_t layer, int64_t slot) { return reinterpret_cast<f16*>(kv.k(layer, slot)); }
f16* v16(const KvCache& kv, int64_t layer, int64_t slot) { return reinterpret_cast<f16*>(kv.v(layer, slot)); }

// What the FP16 cache holds for x.
float stored(float x) { return f16_to_f32(f32_to_f16(x)); }

// Writes K and V of positions [begin, end) of a slot in every layer and head.
void write_positions(KvCache& kv, int64_t layers, int64_t slot, int64_t heads, int64_t head_dim,
                     int64_t begin, int64_t end, float value) {
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t p = begin; p < end; ++p)
        for (int64_t d = 0; d < head_dim; ++d) {
          k16(kv, l, slot)[p * kv.row_stride() + h * head_dim + d] = f32_to_f16(value + float(p));
          v16(kv, l, slot)[p * kv.row_stride() + h * head_dim + d] = f32_to_f16(-value - float(p));
        }
  kv.note_written(slot, end);
}

TEST(KvCache, MillionTokenReservationForQwen3_0_6BCommitsOnlyWhatIsWritten) {
  // Qwen3-0.6B: 28 layers, 8 KV heads, head_dim 128, FP16 -> 112 KiB per position, 112 GiB in all.
  const size_t rss_before = process_resident_bytes();
  KvCache kv(28, 1, 8, kMillion, 128);
  EXPECT_EQ(kv.reserved_bytes(), size_t(28) * 2 * 8 * kMillion * 128 * 2);
  EXPECT_GT(kv.reserved_bytes(), physical_memory_bytes());
  EXPECT_EQ(kv.bytes_per_token(), size_t(28) * 2 * 8 * 128 * 2);
  EXPECT_EQ(kv.resident_bytes(), 0u);

  write_positions(kv, 28, 0, 8, 128, 0, 1000, 1.0f);
  const size_t written = 1000 * kv.bytes_per_token();
  EXPECT_GE(kv.resident_bytes(), written);
  EXPECT_LE(kv.resident_bytes(), written + 28 * 2 * kHuge);
  EXPECT_LT(process_resident_bytes(), rss_before + written + 28 * 2 * kHuge + (64 << 20));

  // The far end of the sequence works too, and costs only its own pages.
  const size_t rss_near = process_resident_bytes();
  write_positions(kv, 1, 0, 1, 128, kMillion - 8, kMillion, 5.0f);
  EXPECT_EQ(f16_to_f32(k16(kv, 0, 0)[(kMillion - 1) * kv.row_stride()]), stored(5.0f + float(kMillion - 1)));
  EXPECT_LE(process_resident_bytes(), rss_near + 2 * kHuge + (16 << 20));

  const size_t rss_full = process_resident_bytes();
  kv.release(0, 0);
  EXPECT_EQ(kv.resident_bytes(), 0u);
  EXPECT_LT(process_resident_bytes(), rss_full - written / 2);
  EXPECT_EQ(k16(kv, 3, 0)[5 * kv.row_stride()], 0);  // released pages read as zero
}

TEST(KvCache, LayoutIsSlotPositionHeadContiguousAndReleaseKeepsThePrefix) {
  const int64_t layers = 2, slots = 3, heads = 2, positions = 4096, hd = 64;
  KvCache kv(layers, slots, heads, positions, hd);
  EXPECT_EQ(kv.row_stride(), heads * hd);
  // A slot's range is whole huge pages: 4096 positions x 256 B = 1 MiB, rounded up to 2 MiB.
  const int64_t slot_elements = int64_t(kHuge / sizeof(f16));
  EXPECT_EQ(k16(kv, 0, 1), k16(kv, 0, 0) + slot_elements);
  EXPECT_EQ(v16(kv, 0, 0), k16(kv, 0, 0) + slots * slot_elements);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(k16(kv, 1, 0)) % kHuge, 0u);
  write_positions(kv, layers, 1, heads, hd, 0, 300, 10.0f);
  EXPECT_EQ(k16(kv, 1, 0)[0], 0);  // other slots untouched
  EXPECT_EQ(k16(kv, 1, 2)[0], 0);

  kv.release(1, 100);  // keep positions [0, 100)
  for (int64_t p = 0; p < 100; ++p) {
    EXPECT_EQ(f16_to_f32(k16(kv, 1, 1)[p * kv.row_stride() + hd + 3]), stored(10.0f + float(p)));
    EXPECT_EQ(f16_to_f32(v16(kv, 0, 1)[p * kv.row_stride()]), stored(-10.0f - float(p)));
  }
  // Whole pages past the cut are gone: 128 FP16 = 256 B per position, 16 positions a page, so
  // the page of positions [96, 112) stays.
  EXPECT_NE(k16(kv, 0, 1)[108 * kv.row_stride()], 0);
  EXPECT_EQ(k16(kv, 0, 1)[112 * kv.row_stride()], 0);
  EXPECT_EQ(v16(kv, 1, 1)[299 * kv.row_stride() + hd], 0);
  EXPECT_LE(kv.resident_bytes(), size_t(layers * 2) * kHuge);
}

TEST(KvCache, CommitMakesPositionsResidentAndIsIdempotent) {
  const int64_t layers = 3, slots = 2, heads = 2, positions = 100000, hd = 32;
  KvCache kv(layers, slots, heads, positions, hd);
  ThreadTeam team(2);
  kv.commit(1, 10, team);
  kv.note_written(1, 10);
  // At least the positions asked for, in every layer's K and V; at most a huge page each.
  const size_t asked = 10 * kv.bytes_per_token();
  EXPECT_GE(kv.resident_bytes(), asked);
  EXPECT_LE(kv.resident_bytes(), size_t(layers * 2) * kHuge);
  const size_t resident = kv.resident_bytes();
  kv.commit(1, 5, team);  // already committed: nothing changes
  EXPECT_EQ(kv.resident_bytes(), resident);
  EXPECT_EQ(k16(kv, 2, 1)[9 * kv.row_stride()], 0);  // committed pages read as zero
  kv.release(1, 0);
  EXPECT_EQ(kv.resident_bytes(), 0u);
  kv.commit(1, 10, team);  // a released range commits again
  kv.note_written(1, 10);
  EXPECT_GE(kv.resident_bytes(), asked);
}

TEST(KvCache, Fp8RowsHoldCodesThenFactorsAndHalveTheBytes) {
  // Qwen3-0.6B's shape: 8 KV heads x 128 codes, then 8 FP32 factors = 1056 bytes per row, against
  // 2048 in FP16 and BF16.
  KvCache fp8(28, 2, 8, kMillion, 128, 0, KvDtype::fp8), bf16(28, 2, 8, 4096, 128, 0, KvDtype::bf16);
  EXPECT_EQ(fp8.row_bytes(), 8u * 128 + 8 * 4);
  EXPECT_EQ(fp8.row_stride(), 8 * 128 + 8 * 4);
  EXPECT_EQ(fp8.bytes_per_token(), size_t(28) * 2 * 1056);
  EXPECT_EQ(bf16.bytes_per_token(), size_t(28) * 2 * 8 * 128 * 2);
  EXPECT_EQ(fp8.k_row(3, 1, 10), fp8.k(3, 1) + 10 * 1056);
  // A position written in every layer is one contiguous run of row_bytes in each range.
  std::vector<float> row(8 * 128);
  for (size_t i = 0; i < row.size(); ++i) row[i] = float(i % 128) - 60.0f;
  write_kv_row(row.data(), 8, 128, KvDtype::fp8, fp8.k_row(0, 1, 7));
  std::vector<std::span<uint8_t>> ranges;
  fp8.ranges(1, 7, 8, ranges);
  ASSERT_EQ(ranges.size(), 28u * 2);
  EXPECT_EQ(ranges[0].data(), fp8.k_row(0, 1, 7));
  EXPECT_EQ(ranges[0].size(), 1056u);
  EXPECT_FLOAT_EQ(kv_row_factors(ranges[0].data(), 8, 128)[5], 67.0f / 448);
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
  EXPECT_EQ(model->kv_bytes_per_token(), size_t(2) * 2 * 8 * 128 * 2);
  {
    ServingLimits fp8 = limits;
    fp8.sequence_length = 64;
    fp8.kv_dtype = KvDtype::fp8;
    EXPECT_EQ(Model::load(dir.path, fp8)->kv_bytes_per_token(), size_t(2) * 2 * (8 * 128 + 8 * 4));
  }
  EXPECT_LT(process_resident_bytes(), size_t(1) << 30);
  EXPECT_EQ(model->kv_resident_bytes(), 0u);

  std::vector<BatchToken> batch;
  for (int i = 0; i < 64; ++i) batch.push_back({i * 3, 0, i, i == 63});
  std::vector<float> logits(1024);
  model->forward(batch, logits.data());
  size_t resident = model->kv_resident_bytes();
  EXPECT_GE(resident, 64 * model->kv_bytes_per_token());
  EXPECT_LE(resident, 2 * 2 * kHuge);  // 2 layers x K, V: within one huge page each
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));

  model->release_kv(0, 0);
  EXPECT_EQ(model->kv_resident_bytes(), 0u);
}

}  // namespace
}  // namespace ellm
