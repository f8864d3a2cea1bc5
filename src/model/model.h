#pragma once
// What the engine sees of a model: load a Hugging Face folder once with serving limits, then
// run forward passes over batches of tokens from any slots. All buffers are sized at load for
// the limits; forward() allocates nothing.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/threads.h"
#include "kernels/kv_dtype.h"
#include "model/config.h"
#include "model/load/mapped_table.h"

namespace ellm {

struct ModelConfig;  // model/config.h

// Where a model reports the work of its passes when a benchmark asks (`ellm bench` sets one);
// without a sink the model measures nothing.
class ProfileSink {
 public:
  virtual ~ProfileSink() = default;
  // One operation of a pass: its name, whether it is a matrix product, its time, its
  // multiply-adds x 2, and the weight and KV bytes it read.
  virtual void op(const char* name, bool is_gemm, double seconds, double flops, double bytes) = 0;
  // The end of a pass: the MoE expert weight bytes it read and the bytes of all experts of all
  // layers (0 and 0 for a dense model), how many times since the last pass the thread team
  // found its cores shared and ran on one thread, and the team's runs and time in them since the
  // last pass (its timing is on while a sink is set).
  virtual void pass(uint64_t expert_bytes_read, size_t expert_weight_bytes,
                    int64_t solo_switches, const TeamTime& team) = 0;
};

// The inputs of INT4 matrix products (--activations): BF16 (the goldens' numeric path), or
// quantised to int8 per 32 inputs for vpdpbusd (kernels.h); automatic: int8 where the tier has
// VNNI (AVX-512, AMX, AVX2 with AVX-VNNI), BF16 on the scalar tier, and on AVX2 without VNNI
// whichever this CPU runs faster (model/load/int4_activations.h).
enum class ActivationDtype { automatic, bf16, int8 };

struct ServingLimits {
  int64_t sequence_length = 4096;  // positions per slot
  int64_t batch_size = 1;          // slots
  int64_t chunk_size = 0;          // most tokens in one forward pass; 0 = sequence_length
  int threads = 0;                 // 0 = one per physical core
  size_t kv_memory_bytes = 0;      // committed-KV budget; 0 = what RAM allows after the weights
  // RAM the server keeps for other things (the session store, the image cache): left out of the
  // automatic KV budget (kv_memory_bytes 0).
  size_t ram_reserved_bytes = 0;
  KvDtype kv_dtype = KvDtype::f16;  // --kv-cache-dtype: the KV cache's element type
  // --attention-products bf16: attention on BF16 products where the tier has them and the cache
  // is FP16 (AttentionShape::bf16_products); the Qwen3 and Qwen3.5+ decoders' full attention.
  bool attention_bf16_products = false;
  bool quantize_fp8 = false;       // --quantize fp8: BF16 linear weights to FP8 at load
  bool quantize_int4 = false;      // --quantize int4: BF16 or FP8 linear weights to INT4 at load
  bool int4_lm_head = true;        // with quantize_int4: lm_head too
  ActivationDtype activations = ActivationDtype::automatic;  // resolved to bf16 or int8 at load
  // Speculative decoding: the most tokens a slot may propose for one check (a group of up to
  // this + 1 speculative tokens per slot; 0 = none), and whether to load the model's own
  // multi-token-prediction head (Qwen3.5+ `mtp.*`) to draft them.
  int64_t speculative_tokens = 0;
  bool mtp = false;
  bool lock_mapped_table = false;  // --mlock-table: pin a table read in place (the n-gram table)
  // --rope-scaling yarn:FACTOR[:ORIGINAL]: YaRN over the config's own RoPE (type "default": none).
  RopeScaling rope_scaling;
  // Leave a vision-language checkpoint's vision tower unread (--language-model-only): text only.
  bool language_model_only = false;
};

// One token of a pass. Tokens of the same slot appear in order with consecutive positions;
// the slot's KV for positions before the first of them must already be written.
struct BatchToken {
  int32_t token;
  int32_t slot;
  int32_t position;
  bool want_logits;
  // Part of a group of tokens being checked (speculative decoding) that may be cut short:
  // the slot's speculative tokens, over one or more passes, stay open until accept().
  bool speculative = false;
  // Hybrid models: where the pass writes a snapshot of the slot's recurrent state after this
  // token (the state at position + 1): state_bytes_per_slot() bytes, laid out as the ranges of
  // state_ranges() one after another. Null: no snapshot. The pass computes the slot's tokens up
  // to here and after here as two runs, so the snapshot is exactly the state a pass ending here
  // leaves.
  uint8_t* snapshot = nullptr;
  // Images (Qwen3.5+): the row that replaces this token's embedding, hidden_size floats (an
  // <|image_pad|>'s share of the vision tower's output), alive until the pass is done. Null:
  // the token's own embedding.
  const float* embedding = nullptr;
  // Multimodal RoPE: the (T, H, W) rotary position where it is not (position, position,
  // position): an image's tokens, and every token after an image (rope_positions, model/rope.h).
  // rope[0] < 0: the text position.
  int32_t rope[3] = {-1, -1, -1};
};

class Model {
 public:
  virtual ~Model() = default;
  // Throws Error with a one-line message naming the file and the problem. A model given
  // `share_threads` runs its passes on that model's thread team (a draft model beside its
  // target: two teams would fight over the same cores).
  static std::unique_ptr<Model> load(const std::string& model_dir, const ServingLimits& limits,
                                     Model* share_threads = nullptr);

  virtual const ModelConfig& config() const = 0;
  virtual const ServingLimits& limits() const = 0;  // with defaults resolved
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_pass_tokens() const = 0;  // chunk_size + batch_size

  // Runs one pass. logits receives one row of vocab_size floats per token with want_logits, in
  // order. Throws Error on a token id outside the vocabulary, a position beyond
  // sequence_length, or more tokens than max_pass_tokens().
  virtual void forward(std::span<const BatchToken> tokens, float* logits) = 0;

  // The same pass in parts, so that the caller can run short passes for other slots between
  // them (decode steps during a long prefill). begin_pass checks and embeds the tokens; each
  // run_part then runs one layer over the next rows (at most max_rows, and not past the end
  // of the layer), layer after layer, and the part that ends the last layer writes the logits
  // and returns true. The math is the same as forward()'s. While a pass is open, forward()
  // takes at most batch_size tokens, none of a slot in the open pass. A part that throws
  // closes the pass.
  virtual void begin_pass(std::span<const BatchToken> tokens) = 0;
  virtual bool run_part(int64_t max_rows, float* logits) = 0;
  // Drops the open pass; the KV its tokens were writing is garbage.
  virtual void cancel_pass() = 0;

  // Gives a slot's KV pages from `from_position` on back to the OS (a hybrid model's slot can
  // then only start over, unless from_position is past its end).
  virtual void release_kv(int slot, int64_t from_position) = 0;
  virtual size_t kv_resident_bytes() const = 0;
  virtual size_t kv_bytes_per_token() const = 0;
  // Whether attention runs on BF16 products (--attention-products bf16, where it applies).
  virtual bool bf16_attention_products() const { return false; }
  // Hybrid models (Qwen3.5+) carry, per slot, a fixed-size recurrent state beside the KV (the
  // Gated DeltaNet layers'). It folds in the whole prefix, so a slot's KV alone cannot resume
  // a sequence: a pass may continue a slot only where its last pass ended, or start it over
  // at position 0 (which resets the state); anything else throws.
  virtual bool has_recurrent_state() const { return false; }
  virtual size_t state_bytes_per_slot() const { return 0; }
  // A slot's recurrent state as byte ranges (one per Gated DeltaNet layer), for copying
  // snapshots in and out as kv_ranges does for KV; none without a recurrent state. for_write
  // makes the state not valid until set_state_end names the position it now holds.
  virtual void state_ranges(int slot, bool for_write, std::vector<std::span<uint8_t>>& out) {}
  // After a snapshot of the state at `position` (tokens [0, position) folded in) was copied in
  // with the KV rows below it: the slot's next pass may continue at `position`.
  virtual void set_state_end(int slot, int64_t position) {}
  // Where the slot's state ends: the position its next pass may continue at (besides 0); -1
  // when it is not valid. Models without a recurrent state return -1.
  virtual int64_t state_end(int slot) const { return -1; }
  virtual size_t weight_bytes() const = 0;

  // Speculative decoding. A slot's speculative tokens (BatchToken::speculative, at most
  // limits().speculative_tokens + 1 of them from the first until accept) are checked and then
  // kept only up to `end`: accept(slot, end) leaves the slot as if only its tokens below `end`
  // had been fed. KV rows beyond are overwritten by later passes; a hybrid model restores its
  // recurrent state to the state after token end - 1. A slot with speculative tokens pending
  // takes no other token until accept. Throws on an `end` outside the group.
  virtual void accept(int slot, int64_t end) {}

  // The multi-token-prediction head (limits().mtp, Qwen3.5+): every pass also runs it over the
  // pairs (hidden state at p - 1, token p) of its tokens, to keep its own KV. mtp_forward then
  // drafts: for each token (a slot's next token, at the position after the slot's last fed one,
  // or a draft at the position after the slot's previous mtp_forward token), one row of logits
  // predicting the token after it. Throws when a slot has no hidden state to continue from.
  // Images: a model with a vision tower names its <|image_pad|> id (-1: no tower) and turns an
  // image's preprocessed patches, [grid_t * grid_h * grid_w][image_patch_floats()], into the
  // rows that replace its pads' embeddings, [grid_t * grid_h * grid_w / 4][hidden_size]. Not
  // during an open pass.
  virtual int32_t image_token_id() const { return -1; }
  virtual int64_t image_patch_floats() const { return 0; }
  void encode_image(const float* pixel_values, int64_t grid_t, int64_t grid_h, int64_t grid_w, float* rows);
  // The same in stages (the tower's blocks), so that a server runs other slots' decode steps
  // between them: begin_image, then image_stage() until it returns true with the rows written.
  // Passes may run between two stages; pixel_values and rows must live until the last one.
  virtual void begin_image(const float* pixel_values, int64_t grid_t, int64_t grid_h, int64_t grid_w,
                           float* rows);
  virtual bool image_stage();
  virtual bool has_mtp() const { return false; }
  virtual void mtp_forward(std::span<const BatchToken> tokens, float* logits) {
    fail_no_mtp();
  }

  // A slot's KV for positions [begin, end) as the byte ranges holding it: for each layer its K
  // rows, then its V rows. Sessions are copied in and out of slots through these; every slot
  // gives ranges of the same sizes in the same order. for_write commits the pages first and
  // counts the positions as written.
  virtual void kv_ranges(int slot, int64_t begin, int64_t end, bool for_write,
                         std::vector<std::span<uint8_t>>& out) = 0;
  // What a KV row holds (dtype, layout version, shape): KV copied from a model with another
  // description, or another fingerprint, must never be restored into this one.
  virtual std::string kv_format() const = 0;
  virtual uint64_t fingerprint() const = 0;  // of the config and the weights, taken at load


  // Reports every later pass to `sink` (nullptr: to none); the sink must outlive its use.
  virtual void set_profile_sink(ProfileSink* sink) {}
  // The thread team its passes run on, for a model loaded to share it (load's share_threads).
  virtual std::shared_ptr<ThreadTeam> thread_team() const { return nullptr; }
  // A table read in place from the checkpoint's mapping (Qwen3.8-Flash-Next's n-gram table):
  // its size, resident share and the page faults its gathers take; safe beside a pass.
  virtual MappedTableStatus mapped_table() const { return {}; }
  // Its pages dropped from memory: the next pass reads a cold table (the benchmark).
  virtual void evict_mapped_table() {}

 protected:
  [[noreturn]] static void fail_no_mtp();
};

// The --kv-memory budget left for KV rows once every slot's recurrent state is counted (0: no
// budget set).
inline size_t kv_budget_after_state(const Model& model) {
  const size_t budget = model.limits().kv_memory_bytes;
  const size_t state = model.state_bytes_per_slot() * size_t(model.limits().batch_size);
  return budget == 0 ? 0 : budget > state ? budget - state : 1;
}

}  // namespace ellm
