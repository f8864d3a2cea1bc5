#include "model/decoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/error.h"
#include "base/log.h"
#include "model/load/fingerprint.h"
#include "model/load/int4_activations.h"

namespace ellm {
namespace {

ServingLimits resolve(ServingLimits limits) {
  if (limits.sequence_length <= 0) fail("--sequence-length", "must be positive");
  if (limits.batch_size <= 0) fail("--batch-size", "must be positive");
  if (limits.chunk_size < 0) fail("--chunk-size", "must not be negative");
  if (limits.threads < 0) fail("--threads", "must not be negative");
  if (limits.chunk_size == 0 || limits.chunk_size > limits.sequence_length)
    limits.chunk_size = limits.sequence_length;
  if (limits.threads == 0) limits.threads = physical_core_count();
  if (limits.speculative_tokens < 0) fail("--num-speculative-tokens", "must not be negative");
  return limits;
}

}  // namespace

void load_decoder_weights(const std::string& model_dir, const ModelConfig& c,
                          const WeightOptions& options, NormReader norm, DecoderWeights& m,
                          const std::function<void(TensorLoader&, const std::string&)>& load_layers) {
  m.store = SafetensorsStore::open(model_dir);
  // A vision-language checkpoint keeps its text model under model.language_model. (its lm_head
  // and the MTP head mtp.* at the top level); model.visual.* is not read.
  const std::string root =
      m.store.find("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  std::vector<std::string> skipped = {"model.visual."};
  if (!options.mtp) skipped.push_back("mtp.");
  for (const std::string& prefix : options.left_mapped) skipped.push_back(root + prefix);
  const std::string embedding = root + "embed_tokens.weight";
  TensorLoader load(m.store, c.int4, options.isa, options.quantize_fp8, options.quantize_int4,
                    options.quantize_lm_head, skipped, c.tie_word_embeddings ? embedding : "");

  const int64_t H = c.hidden_size, V = c.vocab_size;
  m.embedding = load.embedding(embedding, V, H, m.embedding_copy);
  load_layers(load, root);
  if (options.final_norm) m.final_norm = (load.*norm)(root + "norm.weight", H);
  m.lm_head = load.packed({c.tie_word_embeddings ? embedding : "lm_head.weight"},
                          {V}, H, /*quantizable=*/false, /*lm_head=*/true);
  m.bytes = load.bytes();
  m.fp8_bytes = load.fp8_bytes();
  m.int4_bytes = load.int4_bytes();
  std::string summary = std::to_string(m.bytes >> 20) + " MiB";
  if (m.fp8_bytes)
    summary += " (FP8 " + std::to_string(m.fp8_bytes >> 20) + " MiB" +
               (options.quantize_fp8 ? ", quantised at load)" : ")");
  if (m.int4_bytes)
    summary += " (INT4 " + std::to_string(m.int4_bytes >> 20) + " MiB" +
               (options.quantize_int4 ? ", quantised at load)" : ")");
  load.finish(summary);
}

Decoder::Decoder(const ModelConfig& config, const ServingLimits& limits,
                 std::shared_ptr<ThreadTeam> team)
    : config_(config),
      limits_(resolve(limits)),
      max_tokens_(limits_.chunk_size + limits_.batch_size),
      team_owner_(team ? std::move(team) : std::make_shared<ThreadTeam>(limits_.threads)),
      team_(*team_owner_),
      ctx_(team_),
      load_start_(std::chrono::steady_clock::now()) {
  apply_rope_scaling(config_, limits_.rope_scaling);
  rope_ = rope_table(config_);
}

void Decoder::finish_load(const std::string& model_dir, DecoderWeights& weights,
                          const MemoryShape& memory, int64_t widest_input) {
  decoder_weights_ = &weights;
  // --activations auto: resolved once the weights say whether there are INT4 products at all.
  Int4ActivationChoice activation_choice;
  if (limits_.activations == ActivationDtype::automatic) {
    if (weights.int4_bytes > 0) activation_choice = choose_int4_activations();
    limits_.activations = activation_choice.dtype;
  }
  // INT4 products on int8 inputs give other logits, so other KV.
  const bool int8_inputs = limits_.activations == ActivationDtype::int8 && weights.int4_bytes > 0;
  for_each_matrix([&](PackedWeights& w) { w.int8_inputs = int8_inputs && w.int4; });
  fingerprint_ = model_fingerprint(model_dir) ^ (limits_.quantize_fp8 ? 0xf8f8f8f8f8f8f8f8ull : 0) ^
                 (limits_.quantize_int4 ? 0x4444444444444444ull : 0) ^
                 (limits_.quantize_int4 && limits_.int4_lm_head ? 0x4040404040404040ull : 0) ^
                 (int8_inputs ? 0x0808080808080808ull : 0);
  // --rope-scaling rotates the KV otherwise than the folder's config says.
  if (limits_.rope_scaling.is_yarn()) fingerprint_ ^= std::hash<std::string>{}(rope_format(config_));
  memory_ = SequenceMemory(memory, limits_);
  if (memory_.has_state()) {
    const size_t all_slots = state_bytes_per_slot() * size_t(limits_.batch_size);
    if (limits_.kv_memory_bytes > 0 && all_slots >= limits_.kv_memory_bytes)
      fail("--kv-memory", format_bytes(double(limits_.kv_memory_bytes)) + " cannot hold the " +
                              "recurrent state of " + std::to_string(limits_.batch_size) +
                              " slots (" + format_bytes(double(all_slots)) + "), let alone KV");
    if (all_slots + weights.bytes > physical_memory_bytes())
      fail("--batch-size", "the recurrent state of " + std::to_string(limits_.batch_size) +
                               " slots (" + format_bytes(double(all_slots)) +
                               ") and the weights do not fit in RAM");
  }

  const size_t T = size_t(max_tokens_), B = size_t(limits_.batch_size);
  const size_t H = size_t(config_.hidden_size), half = size_t(config_.head_dim / 2);
  const size_t W = size_t(residual_width());
  plan_.build([&](ActivationPlan& p) {
    p.carve(x_, T * W);
    p.carve(step_x_, B * W);
    p.carve(step_rope_cos_, B * half);
    p.carve(step_rope_sin_, B * half);
    p.carve(normed_.xn, T * H);
    p.carve(normed_.xb, T * size_t(widest_input));
    p.carve(rope_cos_, T * half);
    p.carve(rope_sin_, T * half);
    plan(p);
  });
  want_rows_.resize(T);
  pass_.tokens.reserve(T);
  pass_.has_slot.assign(B, 0);
  const bool automatic_budget = limits_.kv_memory_bytes == 0;
  if (automatic_budget) limits_.kv_memory_bytes = automatic_kv_budget();

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start_).count();
  const KvCache& kv = memory_.kv();
  char line[256];
  std::snprintf(
      line, sizeof line,
      "loaded %s in %.2f s (%s, %d threads): weights %s, resident %s, KV reserved %s (%s per token, %s)",
      model_dir.c_str(), seconds, isa_name(active_isa()), team_.size(),
      format_bytes(double(weights.bytes)).c_str(), format_bytes(double(process_resident_bytes())).c_str(),
      format_bytes(double(kv.reserved_bytes())).c_str(), format_bytes(double(kv.bytes_per_token())).c_str(),
      kv_dtype_name(kv.dtype()));
  std::string message = line;
  message += ", KV budget " + format_bytes(double(limits_.kv_memory_bytes)) + (automatic_budget ? " (RAM left)" : "");
  if (weights.int4_bytes > 0) {
    message += int8_inputs ? ", INT4 products on int8 activations" : ", INT4 products on BF16 activations";
    if (activation_choice.measured) {
      std::snprintf(line, sizeof line, " (measured here: int8 %.2fx BF16's speed for one row, %.2fx for a tile)",
                    activation_choice.decode_speedup, activation_choice.prefill_speedup);
      message += line;
    }
  }
  if (bf16_attention_used_)
    message += ", attention on BF16 products";
  else if (limits_.attention_bf16_products)
    message += ", attention in FP32 (--attention-products bf16 takes an fp16 KV cache, a CPU with "
               "AVX-512-BF16 or AMX, and a Qwen3 or Qwen3.5+ model)";
  describe(message);
  log_info(message);
}

bool Decoder::bf16_attention() {
  bf16_attention_used_ = limits_.attention_bf16_products && limits_.kv_dtype == KvDtype::f16 &&
                         has_bf16_attention_products();
  return bf16_attention_used_;
}

// What RAM allows for committed KV once the weights, the recurrent state and the activation plan
// are in: what the kernel (or the container's limit) says is available now, less what the server
// keeps for sessions and images and a margin for threads, the allocator and the page cache of a
// table read in place. Every slot's full sequence may need more: then a request that can never
// fit is refused and sessions leave their slots for the store (engine/scheduler/placement.cc),
// rather than the kernel's OOM killer ending the server.
size_t Decoder::automatic_kv_budget() const {
  const size_t usable = usable_memory_bytes();
  const size_t margin = std::max(physical_memory_bytes() / 16, size_t(512) << 20);
  const size_t state = state_bytes_per_slot() * size_t(limits_.batch_size);
  const size_t kept = limits_.ram_reserved_bytes + margin;
  if (usable <= kept + state)
    fail("--kv-memory", "no RAM is left for KV: " + format_bytes(double(usable)) + " available after the weights, " +
                            format_bytes(double(limits_.ram_reserved_bytes)) +
                            " kept for sessions and images (--session-memory, --image-cache) and " +
                            format_bytes(double(margin)) + " of margin; give --kv-memory, or less to the others");
  return usable - kept;
}

size_t Decoder::state_bytes_per_slot() const {
  return memory_.has_state() ? memory_.state().bytes_per_slot() : 0;
}

void Decoder::validate(std::span<const BatchToken> tokens) const {
  if (int64_t(tokens.size()) > max_tokens_)
    fail("forward", std::to_string(tokens.size()) + " tokens in one pass, more than the planned " +
                        std::to_string(max_tokens_) + " (chunk size + batch size)");
  for (size_t i = 0; i < tokens.size(); ++i) {
    const BatchToken& t = tokens[i];
    if (t.token < 0 || t.token >= config_.vocab_size)
      fail("forward", "token id " + std::to_string(t.token) + " is outside the vocabulary (" +
                          std::to_string(config_.vocab_size) + " ids)");
    if (t.slot < 0 || t.slot >= limits_.batch_size)
      fail("forward", "slot " + std::to_string(t.slot) + " does not exist (batch size " +
                          std::to_string(limits_.batch_size) + ")");
    if (t.position < 0 || t.position >= limits_.sequence_length)
      fail("forward", "position " + std::to_string(t.position) + " is beyond the sequence length " +
                          std::to_string(limits_.sequence_length));
    if (t.snapshot && !memory_.has_state())
      fail("forward", "a token asks for a copy of its recurrent state, but this model has none");
  }
}

void Decoder::forward(std::span<const BatchToken> tokens, float* logits) {
  if (!pass_.open) {
    begin_pass(tokens);
    while (!run_part(int64_t(tokens.size()), logits)) {
    }
    return;
  }
  run_short_pass(tokens, logits);
}

// A short pass between two parts of the open one: its own residual rows, the shared scratch.
void Decoder::run_short_pass(std::span<const BatchToken> tokens, float* logits) {
  validate(tokens);
  if (int64_t(tokens.size()) > limits_.batch_size)
    fail("forward", std::to_string(tokens.size()) + " tokens between the parts of a pass, more than the batch size " +
                        std::to_string(limits_.batch_size));
  for (const BatchToken& t : tokens)
    if (pass_.has_slot[t.slot])
      fail("forward", "slot " + std::to_string(t.slot) + " is in the pass in progress");
  if (tokens.empty()) return;
  memory_.claim(tokens);
  PassRows rows{tokens, step_x_, step_rope_cos_, step_rope_sin_};
  try {
    commit_and_embed(rows);
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) layer(l, rows);
    lm_head(rows, logits);
    after_pass(rows);
  } catch (...) {
    memory_.forget(tokens);
    throw;
  }
  report_pass();
}

void Decoder::cancel_pass() {
  if (pass_.open) memory_.forget(pass_.tokens);
  pass_.open = false;
}

void Decoder::begin_pass(std::span<const BatchToken> tokens) {
  if (pass_.open) fail("begin_pass", "a pass is already in progress");
  validate(tokens);
  memory_.claim(tokens);
  pass_.tokens.assign(tokens.begin(), tokens.end());
  std::fill(pass_.has_slot.begin(), pass_.has_slot.end(), 0);
  for (const BatchToken& t : tokens) pass_.has_slot[t.slot] = 1;
  pass_.layer = pass_.row = 0;
  pass_.open = !tokens.empty();
  if (pass_.open) {
    try {
      commit_and_embed({pass_.tokens, x_, rope_cos_, rope_sin_});
    } catch (...) {
      cancel_pass();
      throw;
    }
  }
}

bool Decoder::run_part(int64_t max_rows, float* logits) {
  if (!pass_.open) return true;
  if (max_rows <= 0) fail("run_part", "a part needs at least one row");
  const int64_t n = int64_t(pass_.tokens.size()), W = residual_width(), half = config_.head_dim / 2;
  try {
    // Rows [begin, end) of layer pass_.layer: attention reads the KV rows earlier parts of this
    // layer wrote, so the parts of a layer add up to the whole layer exactly.
    const int64_t begin = pass_.row, end = std::min(n, begin + max_rows);
    layer(pass_.layer, {std::span(pass_.tokens).subspan(begin, end - begin), x_ + begin * W,
                        rope_cos_ + begin * half, rope_sin_ + begin * half});
    pass_.row = end;
    if (pass_.row == n) {
      pass_.row = 0;
      ++pass_.layer;
    }
    if (pass_.layer < config_.num_hidden_layers) return false;
    const PassRows all{pass_.tokens, x_, rope_cos_, rope_sin_};
    lm_head(all, logits);
    after_pass(all);
  } catch (...) {
    cancel_pass();
    throw;
  }
  pass_.open = false;
  report_pass();
  return true;
}

// Commits the KV pages the tokens will write; x = embed_tokens(input_ids) and each token's
// RoPE angles, once for all layers; every stream of x starts as the embedding.
//                                          x: [n][streams_][H]   cos, sin: [n][head_dim / 2]
void Decoder::commit_and_embed(const PassRows& r) {
  const std::span<const BatchToken> tokens = r.tokens;
  const int64_t n = r.size(), H = config_.hidden_size, half = config_.head_dim / 2;
  const int64_t W = residual_width();
  KvCache& kv = memory_.kv();
  for (const BatchToken& t : tokens) kv.note_written(t.slot, t.position + 1);
  ctx_.profiler.time(Op::kv_commit, 0, 0, [&] {
    for (int64_t t = 0; t < n; ++t)  // the last token of each run of one slot
      if (t + 1 == n || tokens[t + 1].slot != tokens[t].slot)
        kv.commit(tokens[t].slot, tokens[t].position + 1, team_);
  });
  ctx_.profiler.time(Op::embed, 0, double(n * H * 2), [&] {
    ctx_.rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        if (tokens[t].embedding)
          std::copy_n(tokens[t].embedding, H, r.x + t * W);
        else
          convert_bf16_to_f32(decoder_weights_->embedding + int64_t(tokens[t].token) * H, r.x + t * W, H);
        for (int64_t s = 1; s < streams_; ++s) std::copy_n(r.x + t * W, H, r.x + t * W + s * H);
        token_rope_angles(tokens[t], rope_, r.rope_cos + t * half, r.rope_sin + t * half);
      }
    });
  });
}

void Decoder::load_tower(const std::string& model_dir) {
  if (!limits_.language_model_only) tower_ = VisionTower::load_if_present(model_dir, team_);
  if (tower_ && tower_->out_hidden() != config_.hidden_size)
    fail(model_dir + "/config.json", "vision_config.out_hidden_size " + std::to_string(tower_->out_hidden()) +
                                         " is not the text model's hidden_size " +
                                         std::to_string(config_.hidden_size));
  if (tower_ && config_.image_token_id < 0)
    fail(model_dir + "/config.json", "a vision_config needs 'image_token_id' (the <|image_pad|> id)");
}

void Decoder::describe_tower(std::string& line) const {
  if (tower_)
    line += ", vision tower " + format_bytes(double(tower_->weight_bytes())) + " (" +
            std::to_string(tower_->config().depth) + " blocks)";
}

void Decoder::begin_image(const float* pixel_values, int64_t grid_t, int64_t grid_h, int64_t grid_w,
                          float* rows) {
  if (!tower_) Model::begin_image(pixel_values, grid_t, grid_h, grid_w, rows);
  tower_->begin_encode(pixel_values, grid_t, grid_h, grid_w, rows);
}

bool Decoder::image_stage() { return tower_ ? tower_->encode_stage() : Model::image_stage(); }

// logits = norm(x) @ lm_head^T, only for the tokens that want logits.
void Decoder::lm_head(const PassRows& r, float* logits) {
  const std::span<const BatchToken> tokens = r.tokens;
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  int64_t n_want = 0;
  for (int64_t t = 0; t < int64_t(tokens.size()); ++t)
    if (tokens[t].want_logits) want_rows_[n_want++] = int32_t(t);
  if (n_want == 0) return;
  if (!logits) fail("forward", "tokens want logits but no output buffer was given");
  lm_head_input(r.x, want_rows_.data(), n_want);
  ctx_.rows(n_want, [&](int64_t begin, int64_t end) {
    convert_f32_to_bf16(normed_.xn + begin * H, normed_.xb + begin * H, (end - begin) * H);
  });
  ctx_.gemm(Op::lm_head, normed_.xb, n_want, H, decoder_weights_->lm_head, logits, V, false);
}

void Decoder::lm_head_input(const float* x, const int32_t* rows, int64_t n) {
  const int64_t H = config_.hidden_size, W = residual_width();
  ctx_.rows(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      rmsnorm(x + rows[i] * W, 1, H, H, decoder_weights_->final_norm.get(), float(config_.rms_norm_eps),
              normed_.xn + i * H, H);
  });
}

void Decoder::accept(int slot, int64_t end) {
  if (slot < 0 || slot >= limits_.batch_size)
    fail("accept", "slot " + std::to_string(slot) + " does not exist");
  if (pass_.open && pass_.has_slot[slot])
    fail("accept", "slot " + std::to_string(slot) + " is in the pass in progress");
  memory_.accept(slot, end, team_);
}

void Decoder::report_pass() {
  if (ProfileSink* sink = ctx_.profiler.sink()) {
    const int64_t solo = team_.solo_switches();
    const TeamTime team = team_.timing();
    sink->pass(ctx_.expert_bytes_read.exchange(0, std::memory_order_relaxed), decoder_weights_->expert_bytes,
               solo - solo_reported_, team - team_reported_);
    solo_reported_ = solo;
    team_reported_ = team;
  }
}

void Decoder::set_profile_sink(ProfileSink* sink) {
  ctx_.profiler.set_sink(sink);
  ctx_.expert_bytes_read.store(0, std::memory_order_relaxed);
  solo_reported_ = team_.solo_switches();
  team_.set_timing(sink != nullptr);
  team_reported_ = team_.timing();
}

}  // namespace ellm
