#include "model/qwen3.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "model/fingerprint.h"

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
  if (limits.activations == ActivationDtype::automatic) {
    const Isa isa = active_isa();
    const bool vnni = isa >= Isa::avx512 || (isa == Isa::avx2 && avx_vnni_enabled());
    limits.activations = vnni ? ActivationDtype::int8 : ActivationDtype::bf16;
  }
  return limits;
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& model_dir, const ServingLimits& limits,
                                   Model* share_threads) {
  ModelConfig config = load_model_config(model_dir);
  std::shared_ptr<ThreadTeam> team;
  if (auto* other = dynamic_cast<Qwen3Model*>(share_threads)) team = other->team();
  return std::make_unique<Qwen3Model>(model_dir, config, limits, std::move(team));
}

void Model::fail_no_mtp() {
  fail("mtp_forward", "this model has no multi-token-prediction head loaded");
}

Qwen3Model::Qwen3Model(const std::string& model_dir, const ModelConfig& config,
                       const ServingLimits& limits, std::shared_ptr<ThreadTeam> team)
    : config_(config),
      limits_(resolve(limits)),
      max_tokens_(limits_.chunk_size + limits_.batch_size),
      team_owner_(team ? std::move(team) : std::make_shared<ThreadTeam>(limits_.threads)),
      team_(*team_owner_) {
  auto start = std::chrono::steady_clock::now();
  // A group of speculative tokens must run the Gated DeltaNet recurrence token by token, as a
  // decode step does (qwen35.cc: runs of up to kRecurrentRun = 16 tokens), so that its rows
  // equal decode's and the rollback replays the same steps.
  if (config_.is_hybrid() && limits_.speculative_tokens > 15)
    fail("--num-speculative-tokens", "a hybrid model checks at most 15 proposed tokens at once");
  if (limits_.mtp && !config_.is_hybrid())
    fail("--speculative mtp", "only the hybrid Qwen3.5+ models have a multi-token-prediction head; " +
                                  config_.model_type + " has none");
  weights_ = load_weights(model_dir, config_, active_isa(), limits_.quantize_fp8,
                          limits_.quantize_int4, limits_.mtp, limits_.int4_lm_head);
  // INT4 products on int8 inputs give other logits, so other KV.
  const bool int8_inputs = limits_.activations == ActivationDtype::int8 && weights_.int4_bytes > 0;
  set_int8_inputs(weights_, int8_inputs);
  fingerprint_ = model_fingerprint(model_dir) ^ (limits_.quantize_fp8 ? 0xf8f8f8f8f8f8f8f8ull : 0) ^
                 (limits_.quantize_int4 ? 0x4444444444444444ull : 0) ^
                 (limits_.quantize_int4 && limits_.int4_lm_head ? 0x4040404040404040ull : 0) ^
                 (int8_inputs ? 0x0808080808080808ull : 0);
  // KV for the full-attention layers; a hybrid model's Gated DeltaNet layers keep a state.
  int64_t n_full = 0, n_linear = 0;
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const bool linear = config_.is_linear_layer(l);
    kv_layer_.push_back(linear ? -1 : n_full++);
    gdn_layer_.push_back(linear ? n_linear++ : -1);
  }
  if (limits_.mtp) {  // the MTP head's decoder layer: layer num_hidden_layers, with its own KV
    kv_layer_.push_back(n_full++);
    gdn_layer_.push_back(-1);
  }
  kv_ = KvCache(n_full, limits_.batch_size, config_.num_key_value_heads, limits_.sequence_length,
                config_.head_dim);
  if (config_.is_hybrid()) {
    state_ = GdnState(n_linear, limits_.batch_size, config_.linear_conv_kernel_dim,
                      config_.conv_dim(), config_.linear_num_value_heads,
                      config_.linear_key_head_dim, config_.linear_value_head_dim);
    state_end_.assign(size_t(limits_.batch_size), 0);
    if (limits_.speculative_tokens > 0)
      rollback_ = GdnRollback({n_linear, config_.linear_conv_kernel_dim, config_.conv_dim(),
                               config_.linear_num_key_heads, config_.linear_num_value_heads,
                               config_.linear_key_head_dim, config_.linear_value_head_dim},
                              limits_.batch_size, limits_.speculative_tokens + 1);
    const size_t all_slots = state_.bytes_per_slot() * size_t(limits_.batch_size);
    if (limits_.kv_memory_bytes > 0 && all_slots >= limits_.kv_memory_bytes)
      fail("--kv-memory", format_bytes(double(limits_.kv_memory_bytes)) + " cannot hold the " +
                              "recurrent state of " + std::to_string(limits_.batch_size) +
                              " slots (" + format_bytes(double(all_slots)) + "), let alone KV");
    if (all_slots + weights_.bytes > physical_memory_bytes())
      fail("--batch-size", "the recurrent state of " + std::to_string(limits_.batch_size) +
                               " slots (" + format_bytes(double(all_slots)) +
                               ") and the weights do not fit in RAM");
  }

  // HF: inv_freq = 1 / theta^(arange(0, d, 2) / d) over the d rotary dims, in FP32.
  const int64_t hd = config_.head_dim, rd = config_.rotary_dim();
  for (int64_t i = 0; i < rd / 2; ++i)
    inv_freq_.push_back(1.0f / std::pow(float(config_.rope_theta), float(2 * i) / float(rd)));
  // Qwen3 attends to q inside the qkv rows; Qwen3.5's q leaves its gates there (act_.q).
  attention_shape_ = {config_.num_attention_heads,
                      config_.num_key_value_heads,
                      hd,
                      /*ldq=*/config_.is_hybrid() ? config_.q_dim()
                                                  : config_.q_dim() + 2 * config_.kv_dim(),
                      /*ldo=*/config_.q_dim(),
                      kv_.row_stride(),
                      1.0f / std::sqrt(float(hd))};
  plan_activations();

  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char line[256];
  std::snprintf(
      line, sizeof line,
      "loaded %s in %.2f s (%s, %d threads): weights %s, resident %s, KV reserved %s (%s per token)",
      model_dir.c_str(), seconds, isa_name(active_isa()), team_.size(), format_bytes(double(weights_.bytes)).c_str(),
      format_bytes(double(process_resident_bytes())).c_str(), format_bytes(double(kv_.reserved_bytes())).c_str(),
      format_bytes(double(kv_.bytes_per_token())).c_str());
  std::string message = line;
  if (weights_.int4_bytes > 0)
    message += int8_inputs ? ", INT4 products on int8 activations" : ", INT4 products on BF16 activations";
  if (config_.is_hybrid())
    message += ", recurrent state " + format_bytes(double(state_.bytes_per_slot())) + " per slot (" +
               std::to_string(n_linear) + " Gated DeltaNet layers, KV in " + std::to_string(n_full) + ")";
  if (!rollback_.empty())
    message += ", " + format_bytes(double(rollback_.bytes())) + " to roll speculative tokens back";
  if (limits_.mtp) message += ", MTP head loaded";
  log_info(message);
}

void Qwen3Model::plan_activations() {
  const ModelConfig& c = config_;
  const size_t T = size_t(max_tokens_), B = size_t(limits_.batch_size);
  const size_t H = size_t(c.hidden_size), Q = size_t(c.q_dim());
  const size_t W = (c.is_hybrid() ? 2 * Q : Q) + 2 * size_t(c.kv_dim()),
               F = size_t(std::max<int64_t>(c.intermediate_size, 0));
  const size_t CD = size_t(c.conv_dim()), VD = size_t(c.linear_value_dim());
  const size_t HV = size_t(c.linear_num_value_heads), FS = size_t(c.shared_expert_intermediate_size);
  const size_t delta_scratch =
      c.is_hybrid() ? gated_delta_chunk_scratch_floats(c.linear_key_head_dim, c.linear_value_head_dim)
                    : 0;
  const size_t E = size_t(c.num_experts), K = size_t(c.num_experts_per_tok);
  const size_t FE = size_t(c.moe_intermediate_size), TK = T * K;
  size_t scratch =
      attention_scratch_floats(attention_shape_, max_tokens_, max_tokens_, team_.size());

  // Two passes over the same list: first sum the sizes, then hand out pointers.
  uint8_t* base = nullptr;
  size_t offset = 0;
  auto carve = [&](auto*& p, size_t count) {
    using Elem = std::remove_pointer_t<std::remove_reference_t<decltype(p)>>;
    offset = (offset + kAlign - 1) / kAlign * kAlign;
    p = base ? reinterpret_cast<Elem*>(base + offset) : nullptr;  // the sizing pass has no base yet
    offset += count * sizeof(Elem);
  };
  for (int pass = 0; pass < 2; ++pass) {
    offset = 0;
    carve(act_.x, T * H);
    carve(act_.step_x, B * H);
    carve(act_.step_rope_cos, B * size_t(c.head_dim / 2));
    carve(act_.step_rope_sin, B * size_t(c.head_dim / 2));
    carve(act_.xn, T * H);
    carve(act_.xb, T * std::max({H, Q, F, FE, VD, FS}));
    carve(act_.qkv, T * W);
    carve(act_.rope_cos, T * size_t(c.head_dim / 2));
    carve(act_.rope_sin, T * size_t(c.head_dim / 2));
    carve(act_.attn, T * Q);
    carve(act_.gate_up, T * 2 * F);
    carve(act_.act, T * F);
    carve(act_.attention_scratch, scratch);
    carve(act_.router_logits, T * E);
    carve(act_.topk_expert, T * K);
    carve(act_.topk_weight, T * K);
    carve(act_.row_of_choice, T * K);
    carve(act_.token_of_row, TK);
    carve(act_.moe_in, TK * H);
    carve(act_.moe_gate_up, TK * 2 * FE);
    carve(act_.moe_act, TK * FE);
    carve(act_.moe_act_b, TK * FE);
    carve(act_.moe_out, TK * H);
    carve(act_.q, c.is_hybrid() ? T * Q : 0);
    carve(act_.gdn_qkvz, T * (CD + VD));
    carve(act_.gdn_ba, T * 2 * HV);
    carve(act_.gdn_u, T * CD);
    carve(act_.gdn_g, T * HV);
    carve(act_.gdn_beta, T * HV);
    carve(act_.gdn_o, T * VD);
    carve(act_.delta_scratch, size_t(team_.size()) * delta_scratch);
    carve(act_.shared_gate_up, T * 2 * FS);
    carve(act_.shared_out, FS ? T * H : 0);
    carve(act_.mtp_in, limits_.mtp ? T * 2 * H : 0);
    carve(act_.mtp_scratch, limits_.mtp ? T * H : 0);
    if (pass == 0) {
      act_.region = VirtualRegion(offset + kAlign);
      base = act_.region.data();
    }
  }
  act_.seqs.resize(T);
  act_.want_rows.resize(T);
  act_.expert_rows.resize(E + 1);
  act_.runs.resize(T);
  act_.first_runs.resize(T);
  act_.mtp_tokens.resize(limits_.mtp ? T : 0);
  act_.mtp_hidden.resize(limits_.mtp ? T : 0);
  spec_.assign(B, {});
  spec_claim_.assign(B, {});
  spec_opens_.assign(B, 0);
  if (limits_.mtp) {
    mtp_hidden_ = make_buffer<float>(B * size_t(limits_.speculative_tokens + 1) * H);
    mtp_chain_ = make_buffer<float>(B * H);
    mtp_first_.assign(B, -1);
    mtp_rows_.assign(B, 0);
    mtp_chain_position_.assign(B, -1);
  }
  pass_.tokens.reserve(T);
  pass_.has_slot.assign(B, 0);
  claim_end_.assign(B, 0);
  claim_reset_.assign(B, 0);
}

void Qwen3Model::validate(std::span<const BatchToken> tokens) const {
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
    if (t.snapshot && !config_.is_hybrid())
      fail("forward", "a token asks for a copy of its recurrent state, but this model has none");
  }
}

void Qwen3Model::forward(std::span<const BatchToken> tokens, float* logits) {
  if (!pass_.open) {
    begin_pass(tokens);
    while (!run_part(int64_t(tokens.size()), logits)) {
    }
    return;
  }
  // A short pass between two parts of the open one: its own residual rows, the shared scratch.
  validate(tokens);
  if (int64_t(tokens.size()) > limits_.batch_size)
    fail("forward", std::to_string(tokens.size()) + " tokens between the parts of a pass, more than the batch size " +
                        std::to_string(limits_.batch_size));
  for (const BatchToken& t : tokens)
    if (pass_.has_slot[t.slot])
      fail("forward", "slot " + std::to_string(t.slot) + " is in the pass in progress");
  if (tokens.empty()) return;
  check_groups(tokens);
  claim_state(tokens);
  claim_groups();
  PassRows rows{tokens, act_.step_x, act_.step_rope_cos, act_.step_rope_sin};
  try {
    commit_and_embed(rows);
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) layer(l, rows);
    lm_head(rows, logits);
    if (limits_.mtp) mtp_after_pass(rows);
  } catch (...) {
    forget_state(tokens);
    throw;
  }
  report_pass();
}

void Qwen3Model::claim_state(std::span<const BatchToken> tokens) {
  if (!config_.is_hybrid()) return;
  // Check every token first: a refused pass leaves every state as it was.
  std::copy(state_end_.begin(), state_end_.end(), claim_end_.begin());
  std::fill(claim_reset_.begin(), claim_reset_.end(), 0);
  for (const BatchToken& t : tokens) {
    int64_t& end = claim_end_[t.slot];
    if (t.position == 0) {
      claim_reset_[t.slot] = 1;
    } else if (t.position != end) {
      fail("forward", "slot " + std::to_string(t.slot) + " continues at position " +
                          std::to_string(t.position) + " but its recurrent state " +
                          (end < 0 ? std::string("is not valid") : "ends at " + std::to_string(end)) +
                          ": a hybrid model resumes a sequence only with its state");
    }
    end = t.position + 1;
  }
  for (int64_t slot = 0; slot < limits_.batch_size; ++slot) {
    if (claim_reset_[slot]) state_.reset(slot);
    state_end_[slot] = claim_end_[slot];
  }
}

void Qwen3Model::forget_state(std::span<const BatchToken> tokens) {
  for (const BatchToken& t : tokens) {
    close_group(t.slot);
    if (limits_.mtp) mtp_rows_[t.slot] = 0;
    if (config_.is_hybrid()) state_end_[t.slot] = -1;
  }
}

void Qwen3Model::cancel_pass() {
  if (pass_.open) forget_state(pass_.tokens);
  pass_.open = false;
}

void Qwen3Model::begin_pass(std::span<const BatchToken> tokens) {
  if (pass_.open) fail("begin_pass", "a pass is already in progress");
  validate(tokens);
  check_groups(tokens);
  claim_state(tokens);
  claim_groups();
  pass_.tokens.assign(tokens.begin(), tokens.end());
  std::fill(pass_.has_slot.begin(), pass_.has_slot.end(), 0);
  for (const BatchToken& t : tokens) pass_.has_slot[t.slot] = 1;
  pass_.layer = pass_.row = 0;
  pass_.open = !tokens.empty();
  if (pass_.open) {
    try {
      commit_and_embed({pass_.tokens, act_.x, act_.rope_cos, act_.rope_sin});
    } catch (...) {
      cancel_pass();
      throw;
    }
  }
}

bool Qwen3Model::run_part(int64_t max_rows, float* logits) {
  if (!pass_.open) return true;
  if (max_rows <= 0) fail("run_part", "a part needs at least one row");
  const int64_t n = int64_t(pass_.tokens.size()), H = config_.hidden_size, half = config_.head_dim / 2;
  try {
    // Rows [begin, end) of layer pass_.layer: attention reads the KV rows earlier parts of this
    // layer wrote, so the parts of a layer add up to the whole layer exactly.
    const int64_t begin = pass_.row, end = std::min(n, begin + max_rows);
    layer(pass_.layer, {std::span(pass_.tokens).subspan(begin, end - begin), act_.x + begin * H,
                        act_.rope_cos + begin * half, act_.rope_sin + begin * half});
    pass_.row = end;
    if (pass_.row == n) {
      pass_.row = 0;
      ++pass_.layer;
    }
    if (pass_.layer < config_.num_hidden_layers) return false;
    lm_head({pass_.tokens, act_.x, act_.rope_cos, act_.rope_sin}, logits);
    if (limits_.mtp) mtp_after_pass({pass_.tokens, act_.x, act_.rope_cos, act_.rope_sin});
  } catch (...) {
    cancel_pass();
    throw;
  }
  pass_.open = false;
  report_pass();
  return true;
}

// Commits the KV pages the tokens will write; x = embed_tokens(input_ids) and each token's
// RoPE angles, once for all layers.                    x: [n][H]   cos, sin: [n][head_dim / 2]
void Qwen3Model::commit_and_embed(const PassRows& r) {
  const std::span<const BatchToken> tokens = r.tokens;
  const int64_t n = int64_t(tokens.size()), H = config_.hidden_size, half = config_.head_dim / 2;
  const int64_t rotary_half = config_.rotary_dim() / 2;
  for (const BatchToken& t : tokens) kv_.note_written(t.slot, t.position + 1);
  profiler_.time(Op::kv_commit, 0, 0, [&] {
    for (int64_t t = 0; t < n; ++t)  // the last token of each run of one slot
      if (t + 1 == n || tokens[t + 1].slot != tokens[t].slot)
        kv_.commit(tokens[t].slot, tokens[t].position + 1, team_);
  });
  profiler_.time(Op::embed, 0, double(n * H * 2), [&] {
    rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        convert_bf16_to_f32(weights_.embedding + int64_t(tokens[t].token) * H, r.x + t * H, H);
        rope_angles(tokens[t].position, inv_freq_.data(), rotary_half, r.rope_cos + t * half,
                    r.rope_sin + t * half);
      }
    });
  });
}

// One decoder layer over the rows:
// x = x + attention(input_layernorm(x)); x = x + mlp(post_attention_layernorm(x))
void Qwen3Model::layer(int64_t l, const PassRows& r) {
  const LayerWeights& L = weights_.layers[l];
  const int64_t n = int64_t(r.tokens.size());
  if (L.is_linear)
    gdn_block(l, r);
  else
    attention_block(l, r);
  norm_to_bf16(L.post_attention_norm.get(), r.x, n);
  if (L.is_moe) {
    moe_block(L.moe, r.x, n);
    if (L.moe.has_shared) shared_expert(L.moe, r.x, n);
  } else {
    mlp_block(L.mlp, r.x, n);
  }
}

void Qwen3Model::report_pass() {
  if (ProfileSink* sink = profiler_.sink()) {
    const int64_t solo = team_.solo_switches();
    sink->pass(expert_bytes_read_.exchange(0, std::memory_order_relaxed), weights_.expert_bytes,
               solo - solo_reported_);
    solo_reported_ = solo;
  }
}

void Qwen3Model::set_profile_sink(ProfileSink* sink) {
  profiler_.set_sink(sink);
  expert_bytes_read_.store(0, std::memory_order_relaxed);
  solo_reported_ = team_.solo_switches();
}

// xn = rmsnorm(x) * weight; xb = bf16(xn)                   rows [0, n) of [n][H]
void Qwen3Model::norm_to_bf16(const float* weight, const float* x, int64_t n) {
  const int64_t H = config_.hidden_size;
  const float eps = float(config_.rms_norm_eps);
  profiler_.time(Op::norm, 0, 0, [&] {
    rows(n, [&](int64_t begin, int64_t end) {
      rmsnorm(x + begin * H, end - begin, H, H, weight, eps, act_.xn + begin * H, H);
      convert_f32_to_bf16(act_.xn + begin * H, act_.xb + begin * H, (end - begin) * H);
    });
  });
}

// x = x + o_proj(attention(rope(q_norm(q)), rope(k_norm(k)), v)),
// with q, k, v = input_layernorm(x) @ [Wq; Wk; Wv]^T (Qwen3.5: times sigmoid(gate) before o_proj).
void Qwen3Model::attention_block(int64_t layer, const PassRows& r) {
  const std::span<const BatchToken> tokens = r.tokens;
  const LayerWeights& L = weights_.layers[layer];
  const ModelConfig& c = config_;
  const int64_t n = int64_t(tokens.size()), H = c.hidden_size, hd = c.head_dim;
  const int64_t Q = c.q_dim(), W = L.qkv.n, kv_layer = kv_layer_[layer];
  const bool gated = c.is_hybrid();

  norm_to_bf16(L.input_norm.get(), r.x, n);
  // qkv = xb @ Wqkv^T                                   qkv: [n][Q + 2 KV]  (Qwen3.5: [n][2 Q + 2 KV])
  gemm(Op::qkv, act_.xb, n, H, L.qkv, act_.qkv, W, false);
  if (gated)
    gated_qk_norm_rope_to_cache(layer, r);
  else
    qk_norm_rope_to_cache(layer, r);

  // Causal GQA attention, one sequence per run of consecutive tokens of one slot.
  int64_t n_seqs = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (t > 0 && tokens[t].slot == tokens[t - 1].slot &&
        tokens[t].position == tokens[t - 1].position + 1) {
      ++act_.seqs[n_seqs - 1].n_q;
      continue;
    }
    act_.seqs[n_seqs++] = {gated ? act_.q + t * Q : act_.qkv + t * W,
                           act_.attn + t * Q,
                           1,
                           tokens[t].position,
                           kv_.k(kv_layer, tokens[t].slot),
                           kv_.v(kv_layer, tokens[t].slot)};
  }
  // Work: QK^T and PV over each query's causal context; bytes: each sequence's K and V once.
  double attention_flops = 0, kv_bytes = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const AttentionSeq& seq = act_.seqs[s];
    double contexts =
        double(seq.n_q) * double(seq.q_start) + double(seq.n_q) * double(seq.n_q + 1) / 2;
    attention_flops += 4.0 * double(c.num_attention_heads * hd) * contexts;
    kv_bytes +=
        2.0 * double(c.num_key_value_heads * hd) * double(seq.q_start + seq.n_q) * sizeof(f16);
  }
  profiler_.time(Op::attention, attention_flops, kv_bytes, [&] {
    team_.run([&](int m, int nm) {
      attention(act_.seqs.data(), n_seqs, attention_shape_, act_.attention_scratch, m, nm);
    });
  });
  if (gated) apply_output_gate(r);

  // x = x + attn @ Wo^T                                         attn: [n][Q]
  rows(n, [&](int64_t begin, int64_t end) {
    convert_f32_to_bf16(act_.attn + begin * Q, act_.xb + begin * Q, (end - begin) * Q);
  });
  gemm(Op::o_proj, act_.xb, n, Q, L.o_proj, r.x, H, true);
}

// Per token: q = rope(q_norm(q)) and k = rope(k_norm(k)) in place; k and v into the cache.
void Qwen3Model::qk_norm_rope_to_cache(int64_t layer, const PassRows& r) {
  const LayerWeights& L = weights_.layers[layer];
  const ModelConfig& c = config_;
  const int64_t hd = c.head_dim, Q = c.q_dim(), KV = c.kv_dim(), W = Q + 2 * KV;
  const float eps = float(c.rms_norm_eps);
  profiler_.time(Op::qk_norm_rope, 0, 0, [&] {
    rows(int64_t(r.tokens.size()), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* q = act_.qkv + t * W;  // [n_heads][hd]
        float* k = q + Q;             // [n_kv_heads][hd]
        float* v = k + KV;            // [n_kv_heads][hd]
        const float* cos = r.rope_cos + t * (hd / 2);
        const float* sin = r.rope_sin + t * (hd / 2);
        const BatchToken& token = r.tokens[t];
        f16* k_cache = kv_.k(layer, token.slot) + token.position * KV;  // [n_kv_heads][hd]
        f16* v_cache = kv_.v(layer, token.slot) + token.position * KV;
        norm_rope(q, c.num_attention_heads, hd, L.q_norm.get(), eps, cos, sin, q, hd);
        norm_rope(k, c.num_key_value_heads, hd, L.k_norm.get(), eps, cos, sin, k, hd);
        convert_f32_to_f16(k, k_cache, KV);
        convert_f32_to_f16(v, v_cache, KV);
      }
    });
  });
}

// x = x + down(silu(gate(xb)) * up(xb))                   xb: [n][H] = post_attention_layernorm(x)
void Qwen3Model::mlp_block(const SwiGluWeights& mlp, float* x, int64_t n) {
  const int64_t H = config_.hidden_size, F = mlp.down.k;
  gemm(Op::gate_up, act_.xb, n, H, mlp.gate_up, act_.gate_up, 2 * F, false);
  profiler_.time(Op::silu_mul, 0, 0, [&] {
    rows(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        silu_mul(act_.gate_up + t * 2 * F, act_.gate_up + t * 2 * F + F, act_.act + t * F, F);
      convert_f32_to_bf16(act_.act + begin * F, act_.xb + begin * F, (end - begin) * F);
    });
  });
  gemm(Op::down, act_.xb, n, F, mlp.down, x, H, true);
}

// logits = norm(x) @ lm_head^T, only for the tokens that want logits.
void Qwen3Model::lm_head(const PassRows& r, float* logits) {
  const std::span<const BatchToken> tokens = r.tokens;
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  int64_t n_want = 0;
  for (int64_t t = 0; t < int64_t(tokens.size()); ++t)
    if (tokens[t].want_logits) act_.want_rows[n_want++] = int32_t(t);
  if (n_want == 0) return;
  if (!logits) fail("forward", "tokens want logits but no output buffer was given");
  const float eps = float(config_.rms_norm_eps);
  rows(n_want, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      rmsnorm(r.x + act_.want_rows[i] * H, 1, H, H, weights_.final_norm.get(), eps,
              act_.xn + i * H, H);
      convert_f32_to_bf16(act_.xn + i * H, act_.xb + i * H, H);
    }
  });
  gemm(Op::lm_head, act_.xb, n_want, H, weights_.lm_head, logits, V, false);
}

void Qwen3Model::kv_ranges(int slot, int64_t begin, int64_t end, bool for_write,
                           std::vector<std::span<uint8_t>>& out) {
  if (slot < 0 || slot >= limits_.batch_size || begin < 0 || begin > end || end > limits_.sequence_length)
    fail("kv_ranges", "slot " + std::to_string(slot) + " positions [" + std::to_string(begin) + ", " +
                          std::to_string(end) + ") are outside the KV cache");
  if (for_write && end > 0) {
    kv_.commit(slot, end, team_);
    kv_.note_written(slot, end);
    if (config_.is_hybrid()) state_end_[slot] = -1;  // KV written without its state
    close_group(slot);
    if (limits_.mtp) mtp_rows_[slot] = 0, mtp_chain_position_[slot] = -1;
  }
  kv_.ranges(slot, begin, end, out);
}

// Bump the version whenever the KV rows' meaning changes (dtype, RoPE, row layout).
std::string Qwen3Model::kv_format() const {
  if (config_.is_hybrid())  // KV of the full-attention layers only, RoPE on the rotary dims;
    // snapshots of the state (state_ranges): per GDN layer the conv window, then S, FP32
    return "qwen35-kv v1 f16 layers=" + std::to_string(config_.num_hidden_layers) +
           " state=f32 conv[" + std::to_string(config_.linear_conv_kernel_dim - 1) + "][" +
           std::to_string(config_.conv_dim()) + "] S[" + std::to_string(config_.linear_num_value_heads) + "][" +
           std::to_string(config_.linear_key_head_dim) + "][" + std::to_string(config_.linear_value_head_dim) + "]" +
           " full=" + std::to_string(kv_.bytes_per_token() / (2 * sizeof(f16) * size_t(config_.kv_dim()))) +
           " kv_heads=" + std::to_string(config_.num_key_value_heads) +
           " head_dim=" + std::to_string(config_.head_dim) +
           " rotary=" + std::to_string(config_.rotary_dim()) +
           " rope_theta=" + std::to_string(config_.rope_theta);
  return "qwen3-kv v1 f16 layers=" + std::to_string(config_.num_hidden_layers) +
         " kv_heads=" + std::to_string(config_.num_key_value_heads) +
         " head_dim=" + std::to_string(config_.head_dim) + " rope_theta=" + std::to_string(config_.rope_theta);
}

void Qwen3Model::state_ranges(int slot, bool for_write, std::vector<std::span<uint8_t>>& out) {
  if (slot < 0 || slot >= limits_.batch_size)
    fail("state_ranges", "slot " + std::to_string(slot) + " does not exist");
  if (!config_.is_hybrid()) return;
  if (for_write) state_end_[slot] = -1;
  state_.ranges(slot, out);
}

void Qwen3Model::set_state_end(int slot, int64_t position) {
  if (slot < 0 || slot >= limits_.batch_size || position < 0 || position > limits_.sequence_length)
    fail("set_state_end", "slot " + std::to_string(slot) + " position " + std::to_string(position) +
                              " is outside the cache");
  if (config_.is_hybrid()) state_end_[slot] = position;
}

int64_t Qwen3Model::state_end(int slot) const {
  if (slot < 0 || slot >= limits_.batch_size || !config_.is_hybrid()) return -1;
  return state_end_[slot];
}

void Qwen3Model::release_kv(int slot, int64_t from_position) {
  if (slot < 0 || slot >= limits_.batch_size)
    fail("release_kv", "slot " + std::to_string(slot) + " does not exist");
  kv_.release(slot, std::max<int64_t>(from_position, 0));
  if (config_.is_hybrid() && from_position < state_end_[slot]) state_end_[slot] = -1;
  if (from_position < spec_[slot].begin + spec_[slot].count) close_group(slot);
  if (limits_.mtp && from_position < mtp_first_[slot] + mtp_rows_[slot]) mtp_rows_[slot] = 0;
  if (limits_.mtp && from_position <= mtp_chain_position_[slot]) mtp_chain_position_[slot] = -1;
}

}  // namespace ellm
