// Flash attention driver: splits a pass into work items, runs the active tier's attention_block
// (kernel_table.h) over K/V in blocks of kBlockPositions, and merges split (flash-decoding) items.
// What a tier supports (tile rows, scratch, decode shapes) comes from its table.
//
// Work item = (sequence, KV head, tile of queries, range of positions). A tile holds up to the
// tier's attention_tile_rows query rows (32; 256 on BF16 products): tile_queries queries x all
// `group` query heads sharing the KV head, so each K/V block is read once for the whole group.
// Items are dealt to members in order by cumulative cost, which balances the causal triangle of a prefill. When a pass has too few items to keep
// every member busy (decode of few sequences), single-tile sequences are also split along
// positions into chunks; each chunk leaves a partial (max, sum, unnormalised output) and the
// member that finishes last merges them.
//
// A row's attention is the same bits whatever pass, tile or item computed it: positions go in
// segments of kSegmentPositions aligned at absolute positions, each from a fresh softmax state,
// and the segments' states are folded into the row's in order by one function (fold_segment).
// A split item is one segment, and the member that merges folds the items' states in the same
// order; an item over several segments folds them as it goes.
//
// A sequence whose queries x all heads fit one tile (decode) is one item per segment over every KV
// head (a context of one segment is split by KV heads instead), and
// attention_block_all_heads reads its K and V rows front to back, every head of a row at once.
// Every sequence of up to kDecodeQueries queries (a speculative group too) runs that kernel where
// the tier has it for the shape, so its rows are decode's bits; longer ones run the blocks.
// The cache is position-major, so that is one sequential run of memory, which the hardware
// prefetchers follow; one head at a time reads 256 bytes of every 2 KiB row (Qwen3-0.6B, FP16),
// and that ran at about half the bandwidth, with or without software prefetch.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "kernels/kernel_table.h"

namespace ellm {
namespace {

constexpr int64_t kTileRows = 32;        // query rows (query x head) of a split item
// K/V positions per attention_block call of a several-heads item. The BF16 blocks (128
// positions) and the vector tiers' FP32 ones (64 on AVX-512, 16 on AVX2) start at multiples of
// it, as in a one-head item's call over a whole segment, so a row's blocks are the same in both.
constexpr int64_t kBlockPositions = 128;
constexpr int64_t kSegmentPositions = 1024;
constexpr int64_t kHeaderFloats = 16;  // one cache line: the merge counter
// Queries of a sequence that runs the decode kernel: a decode step or a speculative group (up to
// 15 speculative tokens).
constexpr int64_t kDecodeQueries = 16;

struct Plan {
  int64_t group;          // query heads per KV head
  int64_t tile_queries;   // queries per tile
  int64_t max_rows;       // tile_queries * group
  int64_t acc_rows;       // max_rows rounded up to whole 16-row AMX tiles (their padding rows)
  int64_t small_queries;  // a sequence of at most this many queries may be split along positions
  int64_t small_rows;     // small_queries * group: rows of a split item or a whole-sequence one
  int64_t block_floats;   // the tier's block scratch
  int64_t work_floats;    // per-member scratch: the rows' state, the block scratch, a segment's state
  int64_t partial_floats; // one partial: m, l, acc for small_rows rows
  int64_t head_groups;    // parts (by KV heads) of a whole-sequence item too short to split
  int64_t max_chunks;     // segments of a sequence split along positions: up to max_positions
};

// True when the pass runs on the tier's BF16-product blocks: every item, decode's included.
bool bf16_blocks(const AttentionShape& s, const KernelTable& kernels) {
  return s.bf16_products && s.kv_dtype == KvDtype::f16 && kernels.attention_bf16_products.block;
}

// What the tier's blocks keep in the scratch from an earlier call: forgotten.
void forget_block_scratch(const AttentionShape& s, const KernelTable& kernels, float* scratch) {
  auto forget = bf16_blocks(s, kernels) ? kernels.attention_bf16_products.forget_scratch
                                        : kernels.forget_attention_scratch;
  if (forget) forget(scratch);
}

int64_t segments(int64_t positions) { return (positions + kSegmentPositions - 1) / kSegmentPositions; }

Plan make_plan(const AttentionShape& s, int n_members, const KernelTable& kernels) {
  Plan p;
  const bool bf16 = bf16_blocks(s, kernels);
  p.group = s.n_heads / s.n_kv_heads;
  p.tile_queries = std::max<int64_t>(1, (bf16 ? kBf16AttentionTileRows : kernels.attention_tile_rows) / p.group);
  p.max_rows = p.tile_queries * p.group;
  p.acc_rows = (p.max_rows + 15) / 16 * 16;
  p.small_queries = std::max<int64_t>(1, kTileRows / p.group);
  p.small_rows = p.small_queries * p.group;
  // m, l, acc, then the block scratch, then a segment's m, l, acc.
  // (The BF16 blocks run the FP32 ones for the shapes they do not take, in the same scratch.)
  p.block_floats = int64_t(kernels.attention_scratch_floats(p.max_rows, s.head_dim));
  if (bf16)
    p.block_floats = std::max(p.block_floats, int64_t(kernels.attention_bf16_products.scratch_floats(s.head_dim)));
  int64_t work = 2 * (2 * p.max_rows + p.acc_rows * s.head_dim) + p.block_floats;
  p.work_floats = (work + 15) / 16 * 16;
  p.partial_floats = (p.small_rows * (s.head_dim + 2) + 15) / 16 * 16;
  p.head_groups = 1;  // attention() sets it
  p.max_chunks = std::max<int64_t>(1, segments(s.max_positions));
  return p;
}

// Folds one segment's softmax state (max m_s, sum l_s, unnormalised output acc_s) into a row's
// running state; a segment the row does not reach (m_s = -inf) leaves it. Folding into the empty
// state (m = -inf, l = 0, acc = 0) copies the segment's state exactly.
void fold_segment(float& m, float& l, float* acc, float m_s, float l_s, const float* acc_s, int64_t hd) {
  if (m_s == -INFINITY) return;
  const float top = std::max(m, m_s), a = std::exp(m - top), b = std::exp(m_s - top);
  l = l * a + l_s * b;
  for (int64_t d = 0; d < hd; ++d) acc[d] = acc[d] * a + acc_s[d] * b;
  m = top;
}

void write_normalised(float* out, const float* acc, float l, int64_t hd) {
  const float inv = 1.0f / l;
  for (int64_t d = 0; d < hd; ++d) out[d] = acc[d] * inv;
}

struct Item {
  int64_t seq, kv_head, q0, q1, p0, p1;
  int64_t heads;    // KV heads from kv_head on: 1, or all of them for a whole-sequence item
  bool whole;       // a whole-sequence item: all queries, all heads
  int64_t partial;  // index of its partial slot, or -1 when the item writes `out` directly
};

// True when all queries x all heads of the sequence fit one tile: one item covers every head.
bool whole_sequence(const AttentionSeq& seq, const AttentionShape& shape, const Plan& plan) {
  return seq.n_q > 0 && seq.n_q * shape.n_heads <= plan.small_rows;
}

// Chunks sequence `seq` is split into along positions, one segment each (1 = not split).
int64_t chunks_of(const AttentionSeq& seq, const Plan& plan, bool splitting) {
  if (!splitting || seq.n_q == 0 || seq.n_q > plan.small_queries) return 1;
  const int64_t n = segments(seq.q_start + seq.n_q);
  return n <= plan.max_chunks ? n : 1;
}

bool splitting_enabled(const AttentionSeq* seqs, int64_t n_seqs, const AttentionShape& shape,
                       const Plan& plan, int n_members) {
  if (n_members == 1) return false;
  int64_t items = 0;
  for (int64_t i = 0; i < n_seqs; ++i)
    items += whole_sequence(seqs[i], shape, plan)
                 ? 1
                 : (seqs[i].n_q + plan.tile_queries - 1) / plan.tile_queries * shape.n_kv_heads;
  return items < 4 * n_members;
}

// Calls fn(item) for every work item of the pass, in a fixed order.
template <class Fn>
void for_each_item(const AttentionSeq* seqs, int64_t n_seqs, const AttentionShape& shape,
                   const Plan& plan, bool splitting, Fn&& fn) {
  int64_t partial = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const AttentionSeq& seq = seqs[s];
    int64_t chunks = chunks_of(seq, plan, splitting);
    if (whole_sequence(seq, shape, plan)) {
      int64_t end = seq.q_start + seq.n_q;
      if (splitting && chunks == 1 && plan.head_groups > 1) {  // short: split the heads instead
        int64_t groups = std::min(plan.head_groups, shape.n_kv_heads);
        for (int64_t g = 0; g < groups; ++g) {
          int64_t h0 = shape.n_kv_heads * g / groups, h1 = shape.n_kv_heads * (g + 1) / groups;
          fn(Item{s, h0, 0, seq.n_q, 0, end, h1 - h0, true, -1});
        }
        continue;
      }
      for (int64_t c = 0; c < chunks; ++c)
        fn(Item{s, 0, 0, seq.n_q, c * kSegmentPositions, chunks > 1 ? std::min(end, (c + 1) * kSegmentPositions) : end,
                shape.n_kv_heads, true, chunks > 1 ? partial++ : -1});
      continue;
    }
    for (int64_t h = 0; h < shape.n_kv_heads; ++h)
      for (int64_t q0 = 0; q0 < seq.n_q; q0 += plan.tile_queries) {
        int64_t q1 = std::min(seq.n_q, q0 + plan.tile_queries);
        int64_t end = seq.q_start + q1;
        for (int64_t c = 0; c < chunks; ++c) {
          int64_t p0 = c * kSegmentPositions, p1 = chunks > 1 ? std::min(end, p0 + kSegmentPositions) : end;
          fn(Item{s, h, q0, q1, p0, p1, 1, false, chunks > 1 ? partial++ : -1});
        }
      }
  }
}

int64_t item_cost(const Item& it) { return it.heads * (it.q1 - it.q0) * (it.p1 - it.p0 + 32); }

// Row r of an item (head-major: r = head_in_item * rows_per_head + row) in the output.
float* out_row(const Item& it, const AttentionSeq& seq, const AttentionShape& shape, int64_t group,
               int64_t r) {
  int64_t per_head = (it.q1 - it.q0) * group, h = it.kv_head + r / per_head, row = r % per_head;
  return seq.out + (it.q0 + row / group) * shape.ldo + (h * group + row % group) * shape.head_dim;
}

// Head h of a sequence's K (or V) cache at position 0, and (FP8, int8) its factor there.
const void* kv_head(const void* cache, const AttentionShape& shape, int64_t h) {
  return static_cast<const uint8_t*>(cache) + size_t(h * shape.head_dim) * kv_element_bytes(shape.kv_dtype);
}
const float* kv_factors(const void* cache, const AttentionShape& shape, int64_t h) {
  if (!kv_has_factors(shape.kv_dtype)) return nullptr;
  return kv_row_factors(cache, shape.n_kv_heads, shape.head_dim) + h;
}

// True when the sequence's rows run the tier's decode kernel (attention_block_all_heads): a few
// queries (a decode step, a speculative group), in FP32, at a head dim and group it takes. A
// decode row and the same row in a speculative group then are the same bits.
bool decode_rows(const AttentionSeq& seq, const AttentionShape& shape, const Plan& plan,
                 const KernelTable& kernels) {
  return seq.n_q <= kDecodeQueries && !bf16_blocks(shape, kernels) &&
         kernels.all_heads_supports && kernels.all_heads_supports(shape.head_dim, plan.group);
}

// The item's rows over positions [p0, p1) from the state (m, l, acc) they are in.
void run_range(const Item& it, const AttentionSeq& seq, const AttentionShape& shape, const Plan& plan,
               const KernelTable& kernels, int64_t p0, int64_t p1, float* m, float* l, float* acc, float* s) {
  int64_t hd = shape.head_dim, group = plan.group, per_head = (it.q1 - it.q0) * group;
  int64_t first_end = seq.q_start + it.q0 + 1;
  const KvDtype dtype = shape.kv_dtype;
  const bool bf16 = bf16_blocks(shape, kernels);
  AttentionBlockFn* block_fn = bf16 ? kernels.attention_bf16_products.block : kernels.attention_block_for(dtype);
  auto block = [&](const float* q, int64_t h, int64_t b0, int64_t b1, float* bm, float* bl, float* bacc) {
    block_fn(q, shape.ldq, group, per_head, first_end, kv_head(seq.k, shape, h),
                                       kv_head(seq.v, shape, h), kv_factors(seq.k, shape, h),
                                       kv_factors(seq.v, shape, h), shape.kv_row_stride, b0, b1, hd,
                                       shape.scale, bm, bl, bacc, s);
  };
  // heads KV heads from h on, rows [r0, r0 + rows) of each (r0 a multiple of group), whose state
  // is at m, l, acc (head-major, per_head rows a head).
  auto all_heads = [&](int64_t h, int64_t heads, int64_t r0, int64_t rows, float* hm, float* hl, float* hacc) {
    kernels.all_heads_for(dtype)(seq.q + (it.q0 + r0 / group) * shape.ldq + h * group * hd, shape.ldq,
                                 heads, group, rows, first_end + r0 / group, kv_head(seq.k, shape, h),
                                 kv_head(seq.v, shape, h), kv_factors(seq.k, shape, h),
                                 kv_factors(seq.v, shape, h), shape.kv_row_stride, p0, p1, hd,
                                 shape.scale, hm, hl, hacc, s);
  };
  if (decode_rows(seq, shape, plan, kernels)) {
    if (it.whole && kernels.all_heads_supports(hd, per_head)) {
      all_heads(it.kv_head, it.heads, 0, per_head, m, l, acc);
    } else {
      // A speculative group (or another few queries): each head's rows in runs of the kernel's
      // sizes. A row's result does not depend on the run it is in, so it is decode's.
      for (int64_t i = 0; i < it.heads; ++i)
        for (int64_t r0 = 0; r0 < per_head;) {
          int64_t rows = 8;
          while (rows > 1 && (!kernels.all_heads_supports(hd, rows) || rows > per_head - r0)) rows /= 2;
          float* hm = m + i * per_head + r0;
          all_heads(it.kv_head + i, 1, r0, rows, hm, l + i * per_head + r0, acc + (i * per_head + r0) * hd);
          r0 += rows;
        }
    }
    // It wrote over what the tier's block kept in the scratch.
    forget_block_scratch(shape, kernels, s);
  }
  else if (it.heads == 1)  // one call for the whole range: the kernel prepares q once
    block(seq.q + it.q0 * shape.ldq + it.kv_head * group * hd, it.kv_head, p0, p1, m, l, acc);
  else
    for (int64_t p = p0; p < p1; p += kBlockPositions)
      for (int64_t i = 0; i < it.heads; ++i) {
        int64_t h = it.kv_head + i;
        block(seq.q + it.q0 * shape.ldq + h * group * hd, h, p, std::min(p + kBlockPositions, p1),
              m + i * per_head, l + i * per_head, acc + i * per_head * hd);
      }
}

void reset_state(float* m, float* l, float* acc, int64_t rows, int64_t hd) {
  std::fill(m, m + rows, -INFINITY);
  std::fill(l, l + rows, 0.0f);
  std::fill(acc, acc + rows * hd, 0.0f);
}

void run_item(const Item& it, const AttentionSeq& seq, const AttentionShape& shape,
              const Plan& plan, const KernelTable& kernels, float* work, float* partials) {
  int64_t hd = shape.head_dim, group = plan.group;
  int64_t rows = it.heads * (it.q1 - it.q0) * group;
  float* m = work;
  float* l = m + plan.max_rows;
  float* acc = l + plan.max_rows;
  float* s = acc + plan.acc_rows * hd;
  float* segment_m = s + plan.block_floats;
  float* segment_l = segment_m + plan.max_rows;
  float* segment_acc = segment_l + plan.max_rows;
  reset_state(m, l, acc, rows, hd);
  // The first segment straight into the rows' state (what folding it into the empty state gives),
  // each later one from a fresh state, folded in.
  for (int64_t p0 = it.p0; p0 < it.p1;) {
    const int64_t p1 = std::min(it.p1, (p0 / kSegmentPositions + 1) * kSegmentPositions);
    if (p0 == it.p0) {
      run_range(it, seq, shape, plan, kernels, p0, p1, m, l, acc, s);
    } else {
      reset_state(segment_m, segment_l, segment_acc, rows, hd);
      run_range(it, seq, shape, plan, kernels, p0, p1, segment_m, segment_l, segment_acc, s);
      for (int64_t r = 0; r < rows; ++r)
        fold_segment(m[r], l[r], acc + r * hd, segment_m[r], segment_l[r], segment_acc + r * hd, hd);
    }
    p0 = p1;
  }

  if (it.partial >= 0) {
    float* dst = partials + it.partial * plan.partial_floats;
    std::memcpy(dst, m, rows * sizeof(float));
    std::memcpy(dst + plan.small_rows, l, rows * sizeof(float));
    std::memcpy(dst + 2 * plan.small_rows, acc, rows * hd * sizeof(float));
    return;
  }
  for (int64_t r = 0; r < rows; ++r) write_normalised(out_row(it, seq, shape, group, r), acc + r * hd, l[r], hd);
}

// Combines the chunks of every split sequence into `out`.
void merge_partials(const AttentionSeq* seqs, int64_t n_seqs, const AttentionShape& shape,
                    const Plan& plan, const float* partials) {
  int64_t hd = shape.head_dim, group = plan.group, first = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const AttentionSeq& seq = seqs[s];
    int64_t chunks = chunks_of(seq, plan, true);
    if (chunks == 1) continue;
    // Chunks of one item shape: all heads at once, or one KV head at a time.
    bool whole = whole_sequence(seq, shape, plan);
    int64_t heads = whole ? shape.n_kv_heads : 1;
    int64_t rows = heads * seq.n_q * group;
    for (int64_t h = 0; h < shape.n_kv_heads; h += heads, first += chunks) {
      Item it{s, h, 0, seq.n_q, 0, 0, heads, whole, -1};
      for (int64_t r = 0; r < rows; ++r) {
        // The first chunk's row into `out`, then the others folded in, as run_item folds segments.
        float* o = out_row(it, seq, shape, group, r);
        const float* first_part = partials + first * plan.partial_floats;
        float m = first_part[r], l = first_part[plan.small_rows + r];
        std::memcpy(o, first_part + 2 * plan.small_rows + r * hd, hd * sizeof(float));
        for (int64_t c = 1; c < chunks; ++c) {
          const float* part = partials + (first + c) * plan.partial_floats;
          fold_segment(m, l, o, part[r], part[plan.small_rows + r], part + 2 * plan.small_rows + r * hd, hd);
        }
        write_normalised(o, o, l, hd);
      }
    }
  }
}

}  // namespace

size_t attention_scratch_floats(const AttentionShape& shape, int64_t max_tokens, int64_t max_seqs,
                                int n_members) {
  // Sized for the CPU's best tier, whose plan is the largest, so any lower tier fits too.
  Plan plan = make_plan(shape, n_members, kernel_table(best_isa()));
  // Only passes of fewer than 4 items per member split (splitting_enabled), so at most that many
  // sequences, each with one tile per KV head (or one whole-sequence item) of up to max_chunks
  // segments. Pages of partials no pass reaches are never committed.
  int64_t split_seqs = std::min<int64_t>(max_seqs, 4 * n_members);
  int64_t partials = split_seqs * shape.n_kv_heads * plan.max_chunks;
  return size_t(kHeaderFloats + n_members * plan.work_floats + partials * plan.partial_floats);
}

void attention(const AttentionSeq* seqs, int64_t n_seqs, const AttentionShape& shape,
               float* scratch, int member, int n_members) {
  const KernelTable& kernels = kernel_table(active_isa());
  Plan plan = make_plan(shape, n_members, kernels);
  bool splitting = splitting_enabled(seqs, n_seqs, shape, plan, n_members);
  // Fewer sequences than members: one too short to split along positions goes by KV heads.
  plan.head_groups = n_seqs < n_members ? n_members : 1;
  float* work = scratch + kHeaderFloats + member * plan.work_floats;
  float* partials = scratch + kHeaderFloats + n_members * plan.work_floats;
  // What a block kept from an earlier pass (another layer or sequence) is stale.
  forget_block_scratch(shape, kernels, work + 2 * plan.max_rows + plan.acc_rows * shape.head_dim);

  int64_t total = 0;
  for_each_item(seqs, n_seqs, shape, plan, splitting, [&](const Item& it) { total += item_cost(it); });
  // Member takes the items whose cost midpoint falls in its share [lo, hi) of the total.
  double lo = double(total) * member / n_members, hi = double(total) * (member + 1) / n_members;
  int64_t done = 0;
  bool any_split = false;
  for_each_item(seqs, n_seqs, shape, plan, splitting, [&](const Item& it) {
    int64_t cost = item_cost(it);
    double mid = done + cost * 0.5;
    done += cost;
    any_split |= it.partial >= 0;
    if (mid >= lo && mid < hi) run_item(it, seqs[it.seq], shape, plan, kernels, work, partials);
  });
  if (!any_split) return;

  // The scratch header holds the count of members done; the last one merges and resets it.
  std::atomic_ref<uint32_t> finished(*reinterpret_cast<uint32_t*>(scratch));
  if (finished.fetch_add(1, std::memory_order_acq_rel) + 1 == uint32_t(n_members)) {
    merge_partials(seqs, n_seqs, shape, plan, partials);
    finished.store(0, std::memory_order_relaxed);
  }
}

}  // namespace ellm
