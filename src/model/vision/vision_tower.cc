#include "model/vision/vision_tower.h"

#include <algorithm>

#include "base/error.h"
#include "model/load/safetensors.h"
#include "model/load/tensor_loader.h"
#include "model/vision/vision_attention.h"
#include "model/vision/vision_ops.h"
#include "model/vision/vision_positions.h"

namespace ellm {
namespace {

constexpr float kNormEps = 1e-6f;

// Where the tower's tensors are: Qwen3.5's wrapper keeps them under model.visual., some exports
// at the top level as visual.; a folder with neither is reported by the first tensor read.
std::string tower_prefix(const SafetensorsStore& store) {
  if (!store.find("model.visual.patch_embed.proj.weight") &&
      store.find("visual.patch_embed.proj.weight"))
    return "visual.";
  return "model.visual.";
}

VisionNorm load_norm(TensorLoader& load, const std::string& name, int64_t dim) {
  return {load.vector_f32(name + ".weight", dim), load.vector_f32(name + ".bias", dim)};
}

VisionLinear load_linear(TensorLoader& load, const std::string& name, int64_t n, int64_t k) {
  return {load.packed({name + ".weight"}, {n}, k, /*quantizable=*/false),
          load.vector_f32(name + ".bias", n)};
}

VisionWeights load_weights(TensorLoader& load, const std::string& p, const VisionConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, M = c.merged_width();
  VisionWeights w;
  w.patch_embed.weight = load.packed_reshaped(
      p + "patch_embed.proj.weight",
      {H, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}, c.patch_values());
  w.patch_embed.bias = load.vector_f32(p + "patch_embed.proj.bias", H);
  w.position_table = load.matrix_f32(p + "pos_embed.weight", c.num_position_embeddings, H);
  for (int64_t l = 0; l < c.depth; ++l) {
    const std::string b = p + "blocks." + std::to_string(l) + ".";
    w.blocks.push_back({load_norm(load, b + "norm1", H), load_norm(load, b + "norm2", H),
                        load_linear(load, b + "attn.qkv", 3 * H, H),
                        load_linear(load, b + "attn.proj", H, H),
                        load_linear(load, b + "mlp.linear_fc1", I, H),
                        load_linear(load, b + "mlp.linear_fc2", H, I)});
  }
  w.merger_norm = load_norm(load, p + "merger.norm", H);
  w.merger_fc1 = load_linear(load, p + "merger.linear_fc1", M, M);
  w.merger_fc2 = load_linear(load, p + "merger.linear_fc2", c.out_hidden_size, M);
  w.bytes = load.bytes();
  return w;
}

}  // namespace

std::unique_ptr<VisionTower> VisionTower::load(const std::string& model_dir, const VisionConfig& config,
                                               ThreadTeam& team, Isa isa) {
  std::unique_ptr<VisionTower> tower(new VisionTower(config, team));
  const SafetensorsStore store = SafetensorsStore::open(model_dir);
  const std::string prefix = tower_prefix(store);
  TensorLoader loader(store, isa, prefix, "loading vision tower (MiB)");
  tower->weights_ = load_weights(loader, prefix, config);
  loader.finish(std::to_string(tower->weights_.bytes >> 20) + " MiB");
  return tower;
}

std::unique_ptr<VisionTower> VisionTower::load_if_present(const std::string& model_dir,
                                                          ThreadTeam& team, Isa isa) {
  const std::optional<VisionConfig> config = read_vision_config(model_dir);
  return config ? load(model_dir, *config, team, isa) : nullptr;
}

void VisionTower::reserve(int64_t patches, int64_t frame_len) {
  Scratch& s = scratch_;
  if (patches <= s.patches && frame_len <= s.frame_len) return;
  s.patches = std::max(patches, s.patches);
  s.frame_len = std::max(frame_len, s.frame_len);
  const VisionConfig& c = config_;
  const size_t N = size_t(s.patches), S = size_t(s.frame_len), H = size_t(c.hidden_size);
  const size_t widest = size_t(std::max({c.patch_values(), c.intermediate_size, c.hidden_size}));
  s.x = make_buffer<float>(N * H);
  s.xb = make_buffer<bf16>(N * widest);
  s.qkv = make_buffer<float>(N * 3 * H);
  s.attention = make_buffer<float>(N * H);
  s.wide = make_buffer<float>(N * size_t(std::max(c.intermediate_size, c.hidden_size)));
  s.positions = make_buffer<float>(S * H);
  s.cos = make_buffer<float>(S * size_t(c.head_dim() / 2));
  s.sin = make_buffer<float>(S * size_t(c.head_dim() / 2));
  s.attention_scratch = make_buffer<float>(
      vision_attention_scratch_floats(c.num_heads, c.head_dim(), s.patches, s.frame_len, team_.size()));
}

void VisionTower::run_attention(const VisionBlockWeights& b, int64_t frames, int64_t frame_len) {
  const VisionConfig& c = config_;
  const int64_t N = frames * frame_len, H = c.hidden_size;
  const int64_t heads = c.num_heads, hd = c.head_dim(), half = hd / 2;
  Scratch& s = scratch_;
  layer_norm_to_bf16(team_, s.x.get(), N, H, b.norm1, kNormEps, s.xb.get());
  vision_linear(team_, s.xb.get(), N, H, b.qkv, s.qkv.get(), 3 * H, false);
  team_.run([&](int member, int n_members) {
    auto [begin, end] = split_range(N, member, n_members);
    for (int64_t i = begin; i < end; ++i) {
      const float* cos = s.cos.get() + i % frame_len * half;
      const float* sin = s.sin.get() + i % frame_len * half;
      rope_partial(s.qkv.get() + i * 3 * H, heads, hd, hd, cos, sin);      // q
      rope_partial(s.qkv.get() + i * 3 * H + H, heads, hd, hd, cos, sin);  // k
    }
  });
  vision_attention(team_, {heads, hd, frames, frame_len}, s.qkv.get(), s.attention_scratch.get(),
                   s.attention.get());
  to_bf16(team_, s.attention.get(), N * H, s.xb.get());
  vision_linear(team_, s.xb.get(), N, H, b.proj, s.x.get(), H, true);
}

void VisionTower::run_mlp(const VisionBlockWeights& b, int64_t frames, int64_t frame_len) {
  const VisionConfig& c = config_;
  const int64_t N = frames * frame_len, H = c.hidden_size, I = c.intermediate_size;
  Scratch& s = scratch_;
  layer_norm_to_bf16(team_, s.x.get(), N, H, b.norm2, kNormEps, s.xb.get());
  vision_linear(team_, s.xb.get(), N, H, b.fc1, s.wide.get(), I, false);
  gelu_to_bf16(team_, s.wide.get(), N * I, c.tanh_gelu, s.xb.get());
  vision_linear(team_, s.xb.get(), N, I, b.fc2, s.x.get(), H, true);
}

// The merge blocks' rows are consecutive, so [N][H] normed rows are [N / unit][M] merged ones.
void VisionTower::run_merger(int64_t patches, float* out) {
  const VisionConfig& c = config_;
  const int64_t H = c.hidden_size, M = c.merged_width(), tokens = patches / c.merge_unit();
  Scratch& s = scratch_;
  layer_norm_to_bf16(team_, s.x.get(), patches, H, weights_.merger_norm, kNormEps, s.xb.get());
  vision_linear(team_, s.xb.get(), tokens, M, weights_.merger_fc1, s.wide.get(), M, false);
  gelu_to_bf16(team_, s.wide.get(), tokens * M, /*tanh_approximation=*/false, s.xb.get());
  vision_linear(team_, s.xb.get(), tokens, M, weights_.merger_fc2, out, c.out_hidden_size, false);
}

void VisionTower::encode(const float* pixel_values, int64_t grid_t, int64_t grid_h, int64_t grid_w,
                         float* out) {
  begin_encode(pixel_values, grid_t, grid_h, grid_w, out);
  while (!encode_stage()) {
  }
}

void VisionTower::begin_encode(const float* pixel_values, int64_t grid_t, int64_t grid_h, int64_t grid_w,
                               float* out) {
  const VisionConfig& c = config_;
  const int64_t m = c.spatial_merge_size;
  encoding_ = {};
  if (grid_t <= 0 || grid_h <= 0 || grid_w <= 0 || grid_h % m || grid_w % m)
    fail("vision tower", "image grid " + std::to_string(grid_t) + "x" + std::to_string(grid_h) +
                             "x" + std::to_string(grid_w) + " is not made of whole " +
                             std::to_string(m) + "x" + std::to_string(m) + " merge blocks");
  const int64_t S = grid_h * grid_w, N = grid_t * S, H = c.hidden_size, P = c.patch_values();
  reserve(N, S);
  Scratch& s = scratch_;
  to_bf16(team_, pixel_values, N * P, s.xb.get());
  vision_linear(team_, s.xb.get(), N, P, weights_.patch_embed, s.x.get(), H, false);
  interpolate_positions(weights_.position_table.get(), c.position_side(), H, grid_h, grid_w, m,
                        s.positions.get());
  patch_rotary_angles(c.head_dim(), grid_h, grid_w, m, s.cos.get(), s.sin.get());
  team_.run([&](int member, int n_members) {
    auto [begin, end] = split_range(N, member, n_members);
    for (int64_t i = begin; i < end; ++i)
      for (int64_t d = 0; d < H; ++d) s.x[i * H + d] += s.positions[i % S * H + d];
  });
  encoding_ = {out, grid_t, S, 0};
}

bool VisionTower::encode_stage() {
  Encoding& e = encoding_;
  if (!e.out) fail("vision tower", "encode_stage without begin_encode");
  const int64_t blocks = int64_t(weights_.blocks.size());
  if (e.stage < 2 * blocks) {
    const VisionBlockWeights& b = weights_.blocks[size_t(e.stage / 2)];
    if (e.stage % 2 == 0)
      run_attention(b, e.frames, e.frame_len);
    else
      run_mlp(b, e.frames, e.frame_len);
    ++e.stage;
    return false;
  }
  run_merger(e.frames * e.frame_len, e.out);
  e = {};
  return true;
}

}  // namespace ellm
