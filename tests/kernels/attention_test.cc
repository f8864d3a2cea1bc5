// Flash attention over an FP16 cache against a naive softmax(QK^T)V on every tier: GQA, causal offsets (incremental
// prefill), several sequences, several members called in turn and on a real ThreadTeam.
#include <gtest/gtest.h>

#include <cmath>

#include "base/threads.h"
#include "kernels/kv_rows.h"
#include "test_util.h"

namespace ellm {
namespace {

struct SeqSpec {
  int64_t n_q, q_start;
};

constexpr KvDtype kKvDtypes[] = {KvDtype::f16, KvDtype::bf16, KvDtype::fp8, KvDtype::int8};

struct Problem {
  AttentionShape shape;
  int64_t max_positions;
  std::vector<SeqSpec> specs;
  std::vector<std::vector<float>> q, out;  // per sequence
  std::vector<std::vector<uint8_t>> k, v;  // per sequence: the cache, rows of shape.kv_dtype
  std::vector<AttentionSeq> seqs;

  Problem(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, std::vector<SeqSpec> s,
          KvDtype dtype = KvDtype::f16)
      : specs(std::move(s)) {
    max_positions = 0;
    for (auto& sp : specs) max_positions = std::max(max_positions, sp.n_q + sp.q_start);
    int64_t width = n_heads * head_dim;
    // Rows padded past the heads (FP8, int8: by whole floats, so the factors stay aligned).
    const int64_t stride = kv_row_elements(dtype, n_kv_heads, head_dim) + (kv_has_factors(dtype) ? 8 : 5);
    shape = {n_heads, n_kv_heads, head_dim, width + 3, width + 1, stride,
             1.0f / std::sqrt(float(head_dim)), dtype};
    const size_t row_bytes = size_t(stride) * kv_element_bytes(dtype);
    uint32_t seed = 100;
    for (auto& sp : specs) {
      q.push_back(random_floats(std::max<int64_t>(sp.n_q, 1) * shape.ldq, seed++, -2, 2));
      // Heads of each position at a few magnitudes, so FP8 factors differ by position and head.
      const int64_t kv_width = n_kv_heads * head_dim;
      std::vector<float> kf = random_floats(max_positions * kv_width, seed++, -2, 2);
      std::vector<float> vf = random_floats(max_positions * kv_width, seed++);
      for (int64_t i = 0; i < max_positions * kv_width; ++i) {
        const int64_t p = i / kv_width, h = i % kv_width / head_dim;
        kf[i] *= 0.5f + 0.25f * float((p * 3 + h) % 4);
        vf[i] *= 0.5f + 0.25f * float((p + h) % 3);
      }
      k.emplace_back(max_positions * row_bytes, uint8_t(0x5a));
      v.emplace_back(max_positions * row_bytes, uint8_t(0x5a));
      for (int64_t p = 0; p < max_positions; ++p) {
        write_kv_row(kf.data() + p * kv_width, n_kv_heads, head_dim, dtype, k.back().data() + p * row_bytes);
        write_kv_row(vf.data() + p * kv_width, n_kv_heads, head_dim, dtype, v.back().data() + p * row_bytes);
      }
      out.emplace_back(std::max<int64_t>(sp.n_q, 1) * shape.ldo, -7.0f);
    }
    for (size_t i = 0; i < specs.size(); ++i)
      seqs.push_back({q[i].data(), out[i].data(), specs[i].n_q, specs[i].q_start, k[i].data(),
                      v[i].data()});
  }

  // Element d of KV head h at position p of sequence s's K (or V) cache, as the cache holds it.
  double kv_at(const std::vector<uint8_t>& cache, int64_t p, int64_t h, int64_t d) const {
    const uint8_t* row = cache.data() + size_t(p * shape.kv_row_stride) * kv_element_bytes(shape.kv_dtype);
    return kv_element(row, shape.kv_dtype, shape.n_kv_heads, shape.head_dim, h, d);
  }

  // out for query i, head h of sequence s, computed the obvious way in double from the cache's
  // values (FP8: codes times factors).
  std::vector<double> naive(size_t s, int64_t i, int64_t h) const {
    int64_t hd = shape.head_dim, kvh = h / (shape.n_heads / shape.n_kv_heads);
    int64_t pos = specs[s].q_start + i;
    const float* qi = q[s].data() + i * shape.ldq + h * hd;
    std::vector<double> scores(pos + 1), o(hd, 0);
    double max = -1e300, sum = 0;
    for (int64_t p = 0; p <= pos; ++p) {
      double dot = 0;
      for (int64_t d = 0; d < hd; ++d) dot += double(qi[d]) * kv_at(k[s], p, kvh, d);
      scores[p] = dot * shape.scale;
      max = std::max(max, scores[p]);
    }
    for (int64_t p = 0; p <= pos; ++p) {
      double w = std::exp(scores[p] - max);
      sum += w;
      for (int64_t d = 0; d < hd; ++d) o[d] += w * kv_at(v[s], p, kvh, d);
    }
    for (auto& x : o) x /= sum;
    return o;
  }

  void run(int n_members, ThreadTeam* team) {
    for (auto& o : out) std::fill(o.begin(), o.end(), -7.0f);
    int64_t tokens = 0;
    for (auto& sp : specs) tokens += sp.n_q;
    std::vector<float> scratch(
        attention_scratch_floats(shape, tokens, int64_t(specs.size()), n_members), 0.0f);
    for (int round = 0; round < 2; ++round) {  // the second round reuses the scratch as left
      if (team)
        team->run([&](int member, int n) {
          attention(seqs.data(), int64_t(seqs.size()), shape, scratch.data(), member, n);
        });
      else
        for (int member = 0; member < n_members; ++member)
          attention(seqs.data(), int64_t(seqs.size()), shape, scratch.data(), member, n_members);
    }
  }

  // With shape.bf16_products, the AVX-512 and AMX tiers round Q, K, P and V to BF16 (8
  // significant bits) for the products over an FP16 cache (kernels/bf16_attention.h), so their
  // outputs (weighted means of V in [-1, 1]) may be off by a few 1e-3 (5e-3 at most seen here).
  // Other shapes, caches and tiers compute in FP32.
  bool bf16_products() const {
    return shape.bf16_products && active_isa() >= Isa::avx512 && shape.kv_dtype == KvDtype::f16 &&
           shape.head_dim % 32 == 0 && shape.head_dim <= 256;
  }
  // naive(s, i, h) of every query and head, computed once: the cache and queries never change.
  mutable std::vector<std::vector<double>> expected;
  const std::vector<double>& expected_output(size_t s, int64_t i, int64_t h) const {
    if (expected.empty())
      for (size_t t = 0; t < specs.size(); ++t)
        for (int64_t j = 0; j < specs[t].n_q; ++j)
          for (int64_t g = 0; g < shape.n_heads; ++g) expected.push_back(naive(t, j, g));
    size_t at = 0;
    for (size_t t = 0; t < s; ++t) at += size_t(specs[t].n_q * shape.n_heads);
    return expected[at + size_t(i * shape.n_heads + h)];
  }

  void expect_matches_naive(const std::string& what) const {
    const double tolerance = bf16_products() ? 1e-2 : 2e-5;
    for (size_t s = 0; s < specs.size(); ++s)
      for (int64_t i = 0; i < specs[s].n_q; ++i)
        for (int64_t h = 0; h < shape.n_heads; ++h) {
          const std::vector<double>& want = expected_output(s, i, h);
          const float* got = out[s].data() + i * shape.ldo + h * shape.head_dim;
          for (int64_t d = 0; d < shape.head_dim; ++d)
            ASSERT_NEAR(got[d], want[d], tolerance)
                << what << " seq " << s << " query " << i << " head " << h << " dim " << d;
        }
    // Padding past n_heads * head_dim is untouched.
    for (size_t s = 0; s < specs.size(); ++s)
      for (int64_t i = 0; i < specs[s].n_q; ++i)
        ASSERT_EQ(out[s][i * shape.ldo + shape.n_heads * shape.head_dim], -7.0f) << what;
  }
};

std::string label(Isa isa, int members, KvDtype dtype = KvDtype::f16) {
  return std::string(isa_name(isa)) + " members=" + std::to_string(members) + " kv=" + kv_dtype_name(dtype);
}

TEST(Attention, PrefillWithGqaAndSeveralSequences) {
  // group 2, 3 and 8; a fresh prompt, an incremental prefill and a one-token decode together.
  // Head dims 24 and 80 leave partial vectors and a partial K transpose tile.
  for (auto [heads, kv, hd] : {std::tuple{4, 2, 16}, std::tuple{6, 2, 8}, std::tuple{8, 1, 32},
                               std::tuple{4, 2, 24}, std::tuple{6, 3, 80}}) {
    for (KvDtype dtype : kKvDtypes) {
      Problem p(heads, kv, hd, {{37, 0}, {20, 45}, {1, 70}, {0, 5}}, dtype);
      for (Isa isa : supported_isas()) {
        IsaScope scope(isa);
        for (int members : {1, 2, 5}) {
          p.run(members, nullptr);
          p.expect_matches_naive(label(isa, members, dtype) + " heads=" + std::to_string(heads));
        }
      }
    }
  }
}

TEST(Attention, DecodeSplitsLongContextAcrossMembers) {
  // Few sequences, few KV heads, long context: positions are split across members and merged.
  Problem p(4, 1, 64, {{1, 1500}, {3, 900}});
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    for (int members : {1, 2, 4, 7}) {
      p.run(members, nullptr);
      p.expect_matches_naive(label(isa, members));
    }
  }
}

TEST(Attention, DecodeOverAllHeadsInMemoryOrder) {
  // Decode sequences are one item over every KV head (attention_block_all_heads): groups 1, 2, 4
  // and 8 (odd and even rows per head), head dims 128, 64 and 256 (the register paths) and 80 (head
  // by head), two queries at once, contexts that end mid-block of 16, and one KV head.
  for (auto [heads, kv, hd] : {std::tuple{8, 8, 128}, std::tuple{16, 8, 128}, std::tuple{16, 4, 128},
                               std::tuple{16, 2, 64}, std::tuple{8, 4, 80}, std::tuple{4, 1, 64},
                               std::tuple{8, 2, 256}}) {
    for (KvDtype dtype : kKvDtypes) {
      // The other dtypes on one shape per register path (and the head-by-head one): CI time.
      if (dtype != KvDtype::f16 && heads == 8 && kv != 4) continue;
      if (dtype != KvDtype::f16 && heads == 16 && kv == 4) continue;
      if (dtype != KvDtype::f16 && dtype != KvDtype::fp8 && hd == 256) continue;
      Problem p(heads, kv, hd, {{1, 1000}, {2, 37}, {1, 0}, {1, 16}}, dtype);
      // One sequence too short to split along positions: its KV heads are split across members.
      Problem alone(heads, kv, hd, {{1, 40}}, dtype);
      for (Isa isa : supported_isas()) {
        IsaScope scope(isa);
        for (int members : {1, 2, 3}) {
          std::string what = label(isa, members, dtype) + " heads=" + std::to_string(heads) +
                             " kv heads=" + std::to_string(kv) + " hd=" + std::to_string(hd);
          p.run(members, nullptr);
          p.expect_matches_naive(what);
          alone.run(members, nullptr);
          alone.expect_matches_naive(what + " one short sequence");
        }
      }
    }
  }
}

TEST(Attention, RealThreadTeam) {
  ThreadTeam team(3, /*pin=*/false);
  Problem prefill(16, 8, 128, {{50, 0}, {10, 30}});
  Problem decode(8, 2, 128, {{1, 1200}});
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    prefill.run(3, &team);
    prefill.expect_matches_naive(label(isa, 3) + " team prefill");
    decode.run(3, &team);
    decode.expect_matches_naive(label(isa, 3) + " team decode");
  }
}

// On BF16 products, prefill tiles of up to 256 rows (several per KV head), decode rows and
// queries too few for a tile, head dims the BF16 blocks take (32, 64, 128) and one they leave to
// FP32 (80), over several member counts and a real team.
TEST(Attention, Bf16ProductsMatchTheNaiveResult) {
  bool any = false;
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    any = any || has_bf16_attention_products();
  }
  if (!any) GTEST_SKIP() << "no tier here has BF16 attention products (AVX-512-BF16 or AMX)";
  for (auto [heads, kv, hd] : {std::tuple{16, 8, 128}, std::tuple{8, 2, 64}, std::tuple{4, 2, 32},
                               std::tuple{6, 3, 80}}) {
    Problem p(heads, kv, hd, {{300, 0}, {37, 0}, {20, 45}, {1, 70}, {1, 300}, {3, 130}, {0, 5}});
    p.shape.bf16_products = true;
    for (Isa isa : supported_isas()) {
      IsaScope scope(isa);
      if (!has_bf16_attention_products()) continue;  // FP32: the tests above
      for (int members : {1, 2, 3}) {
        p.run(members, nullptr);
        p.expect_matches_naive(label(isa, members) + " bf16 products heads=" + std::to_string(heads));
      }
    }
  }
  ThreadTeam team(2, /*pin=*/false);
  Problem p(16, 8, 128, {{200, 0}, {1, 900}});
  p.shape.bf16_products = true;
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    if (!has_bf16_attention_products()) continue;
    p.run(2, &team);
    p.expect_matches_naive(label(isa, 2) + " bf16 products, team");
  }
}

// A query's output must not depend on the pass it is in: a prompt attended in one pass equals
// the same queries fed in smaller passes over the same cache (chunked prefill, then decode), to
// the bit, on every tier and member count. In FP32, head dims off 64 and 128, so decode runs the
// same block kernel as prefill (those two have their own decode kernel, checked against the
// naive result above); on BF16 products every row runs the BF16 blocks, so 64 and 128 too.
// Contexts under 512, so no pass is split along positions.
TEST(Attention, QueryResultDoesNotDependOnThePass) {
  const int64_t n = 95;
  const std::vector<int64_t> feeds = {48, 1, 1, 1, 20, 1, 13, 1, 9};  // sums to 95
  for (auto [heads, kv, hd, dtype, bf16] :
       {std::tuple{4, 2, 32, KvDtype::f16, false}, std::tuple{6, 2, 24, KvDtype::f16, false},
        std::tuple{4, 2, 32, KvDtype::fp8, false}, std::tuple{6, 2, 24, KvDtype::fp8, false},
        std::tuple{4, 2, 32, KvDtype::bf16, false}, std::tuple{6, 2, 24, KvDtype::int8, false},
        std::tuple{16, 8, 128, KvDtype::f16, true}, std::tuple{8, 2, 64, KvDtype::f16, true},
        std::tuple{4, 2, 32, KvDtype::f16, true}}) {
    Problem p(heads, kv, hd, {{n, 0}}, dtype);
    p.shape.bf16_products = bf16;
    for (Isa isa : supported_isas()) {
      IsaScope scope(isa);
      if (bf16 && !p.bf16_products()) continue;  // FP32 with its decode kernel at 64 and 128
      for (int members : {1, 2}) {
        p.run(members, nullptr);
        std::vector<float> fed(p.out[0].size(), -7.0f);
        std::vector<float> scratch(attention_scratch_floats(p.shape, n, 1, members), 0.0f);
        int64_t q0 = 0;
        for (int64_t count : feeds) {
          AttentionSeq seq{p.q[0].data() + q0 * p.shape.ldq, fed.data() + q0 * p.shape.ldo, count,
                           q0, p.k[0].data(), p.v[0].data()};
          for (int member = 0; member < members; ++member)
            attention(&seq, 1, p.shape, scratch.data(), member, members);
          q0 += count;
        }
        ASSERT_EQ(q0, n);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t c = 0; c < heads * hd; ++c)
            ASSERT_EQ(fed[i * p.shape.ldo + c], p.out[0][i * p.shape.ldo + c])
                << label(isa, members, dtype) << (bf16 ? " bf16 products" : "") << " hd=" << hd
                << " query " << i << " element " << c;
      }
    }
  }
}

// Past a few segments of positions (1024 each) a decode row is split across members
// (flash-decoding) when its pass has few items, and not when other sequences keep the members
// busy: either way, and in a prefill, the row is the same bits.
TEST(Attention, LongContextRowDoesNotDependOnSplitOrBatch) {
  const int64_t n = 2600, heads = 4, kv = 2, hd = 32;
  const std::vector<int64_t> rows = {n - 1, n - 2, 1500, 1023, 1024, 2047};
  // int8: DecodeRowOverAllHeadsDoesNotDependOnBatch; the last: FP16 on BF16 products.
  for (auto [dtype, bf16] : {std::pair{KvDtype::f16, false}, std::pair{KvDtype::fp8, false},
                             std::pair{KvDtype::f16, true}}) {
  Problem p(heads, kv, hd, {{n, 0}}, dtype);
  p.shape.bf16_products = bf16;
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    if (bf16 && !p.bf16_products()) continue;  // FP32 on this tier: the first case
    p.run(2, nullptr);  // the prefill: every row at once, tiles of queries
    for (int64_t i : rows)
      for (int64_t c = 0; c < heads * hd; ++c) {
        // The row checked against the naive computation once, at the first element of each head.
        if (c % hd == 0) {
          std::vector<double> want = p.naive(0, i, c / hd);
          ASSERT_NEAR(p.out[0][i * p.shape.ldo + c], want[0], p.bf16_products() ? 2e-3 : 1e-4)
              << isa_name(isa) << " query " << i;
        }
      }
    for (int64_t busy : {0, 7}) {  // alone (split along positions), or beside 7 other sequences
      for (int64_t i : rows) {
        std::vector<float> out(p.shape.ldo, -7.0f);
        std::vector<AttentionSeq> seqs = {{p.q[0].data() + i * p.shape.ldq, out.data(), 1, i, p.k[0].data(), p.v[0].data()}};
        std::vector<std::vector<float>> others(size_t(busy), std::vector<float>(p.shape.ldo));
        for (auto& o : others) seqs.push_back({p.q[0].data(), o.data(), 1, 200, p.k[0].data(), p.v[0].data()});
        for (int members : {1, 2}) {
          std::vector<float> scratch(attention_scratch_floats(p.shape, int64_t(seqs.size()), int64_t(seqs.size()), members), 0.0f);
          for (int member = 0; member < members; ++member)
            attention(seqs.data(), int64_t(seqs.size()), p.shape, scratch.data(), member, members);
          for (int64_t c = 0; c < heads * hd; ++c)
            ASSERT_EQ(out[c], p.out[0][i * p.shape.ldo + c])
                << label(isa, members, dtype) << (bf16 ? " bf16 products" : "") << " query " << i
                << " element " << c << " beside " << busy;
        }
      }
    }
  }
  }
}

// The decode kernels (head dims 64, 128 and 256, all KV heads at once) give a row the same bits alone,
// beside other sequences, and split across members, for every KV dtype.
TEST(Attention, DecodeRowOverAllHeadsDoesNotDependOnBatch) {
  const int64_t n = 2100;
  for (auto [heads, kv, hd] : {std::tuple{16, 8, 128}, std::tuple{8, 2, 64}, std::tuple{8, 2, 256}})
    for (KvDtype dtype : kKvDtypes) {
      if (hd == 256 && dtype != KvDtype::f16 && dtype != KvDtype::fp8) continue;  // CI time
      Problem p(heads, kv, hd, {{1, n - 1}}, dtype);
      for (Isa isa : supported_isas()) {
        IsaScope scope(isa);
        std::vector<float> first;
        for (int64_t busy : {0, 5})
          for (int members : {1, 2, 3}) {
            std::vector<float> out(p.shape.ldo, -7.0f);
            std::vector<AttentionSeq> seqs = {{p.q[0].data(), out.data(), 1, n - 1, p.k[0].data(), p.v[0].data()}};
            std::vector<std::vector<float>> others(size_t(busy), std::vector<float>(p.shape.ldo));
            for (auto& o : others) seqs.push_back({p.q[0].data(), o.data(), 1, 300, p.k[0].data(), p.v[0].data()});
            std::vector<float> scratch(attention_scratch_floats(p.shape, int64_t(seqs.size()), int64_t(seqs.size()), members), 0.0f);
            for (int member = 0; member < members; ++member)
              attention(seqs.data(), int64_t(seqs.size()), p.shape, scratch.data(), member, members);
            if (first.empty()) {
              first = out;
              for (int64_t h = 0; h < heads; h += 5)
                ASSERT_NEAR(out[h * hd], p.naive(0, 0, h)[0], 1e-4) << label(isa, members, dtype);
            }
            for (int64_t c = 0; c < heads * hd; ++c)
              ASSERT_EQ(out[c], first[c]) << label(isa, members, dtype) << " hd=" << hd << " element " << c << " beside " << busy;
          }
      }
    }
}

TEST(Attention, ScaleOfLargeScoresStaysFinite) {
  // Scores around 1e3 would overflow a softmax without the running max.
  Problem p(2, 1, 8, {{5, 10}});
  for (auto& x : p.q[0]) x *= 400;
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    p.run(2, nullptr);
    for (float x : p.out[0]) ASSERT_TRUE(std::isfinite(x));
  }
}

// A speculative group (a few queries of one sequence in one pass) gives each row the bits the
// decode step at its position gives: at the head dims with a decode kernel (64, 128) too, for
// every group of query heads it takes, KV dtype, tier and member count, past one segment of
// positions (so split along positions when alone).
TEST(Attention, SpeculativeGroupRowsAreDecodeRows) {
  const int64_t n = 1100, first = n - 20;  // rows [first, n) compared
  for (auto [heads, kv, hd] : {std::tuple{16, 8, 128}, std::tuple{8, 2, 64}, std::tuple{8, 1, 64},
                               std::tuple{2, 2, 128}, std::tuple{8, 2, 256}})
    for (KvDtype dtype : kKvDtypes) {
      Problem p(heads, kv, hd, {{n, 0}}, dtype);
      const int64_t ldo = p.shape.ldo;
      for (Isa isa : supported_isas()) {
        IsaScope scope(isa);
        for (int members : {1, 2}) {
          if (isa == Isa::scalar && members == 2) continue;  // the slowest tier: one member
          std::vector<float> scratch(attention_scratch_floats(p.shape, 16, 1, members), 0.0f);
          auto run = [&](int64_t q0, int64_t count, float* out) {
            AttentionSeq seq{p.q[0].data() + q0 * p.shape.ldq, out + (q0 - first) * ldo, count, q0,
                             p.k[0].data(), p.v[0].data()};
            for (int member = 0; member < members; ++member)
              attention(&seq, 1, p.shape, scratch.data(), member, members);
          };
          std::vector<float> decode(size_t((n - first) * ldo), -7.0f), group(decode.size(), -5.0f);
          for (int64_t i = first; i < n; ++i) run(i, 1, decode.data());
          int64_t q0 = first;
          for (int64_t count : {2, 3, 5, 1, 9})  // sums to 20
            run(q0, count, group.data()), q0 += count;
          ASSERT_EQ(q0, n);
          for (int64_t i = 0; i < n - first; ++i)
            for (int64_t c = 0; c < heads * hd; ++c)
              ASSERT_EQ(group[i * ldo + c], decode[i * ldo + c])
                  << label(isa, members, dtype) << " heads=" << heads << "/" << kv << " hd=" << hd
                  << " query " << first + i << " element " << c;
        }
      }
    }
}

}  // namespace
}  // namespace ellm
