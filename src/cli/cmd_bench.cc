// ellm bench: the machine's own limits, then prefill and decode speed of a model folder,
// reported as JSON lines and a readable table, each figure beside the limit it is bound by.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <functional>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/cpu.h"
#include "base/error.h"
#include "base/memory.h"
#include "base/threads.h"
#include "cli/bench_vision.h"
#include "cli/commands.h"
#include "model/config.h"
#include "model/model.h"
#include "text/tokenizer/tokenizer.h"
#include "tools/busy_process.h"
#include "tools/machine_limits.h"

namespace ellm {
namespace {

using json = nlohmann::json;

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) {
      size_t used = 0;
      int64_t value = -1;
      try {
        value = std::stoll(item, &used);
      } catch (const std::exception&) {
      }
      if (used != item.size() || value <= 0)
        fail(text, "expected a comma-separated list of positive integers");
      out.push_back(value);
    }
  return out;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n == 0 ? 0 : n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// What the model reports of its passes since the last reset(): time and work per operation, in
// the order first seen, MoE expert bytes read and solo switches.
struct PassTotals final : ProfileSink {
  struct OpTotal {
    std::string name;
    bool is_gemm = false;
    double seconds = 0, flops = 0, bytes = 0;
  };
  std::vector<OpTotal> ops;
  uint64_t expert_bytes_read = 0;
  size_t expert_weight_bytes = 0;
  int64_t solo_switches = 0;
  TeamTime team;

  void reset() {
    ops.clear();
    expert_bytes_read = 0;
    solo_switches = 0;
    team = {};
  }
  void op(const char* name, bool is_gemm, double seconds, double flops, double bytes) override {
    auto it = std::find_if(ops.begin(), ops.end(), [&](const OpTotal& o) { return o.name == name; });
    if (it == ops.end()) it = ops.insert(ops.end(), OpTotal{name, is_gemm});
    it->seconds += seconds;
    it->flops += flops;
    it->bytes += bytes;
  }
  void pass(uint64_t expert_bytes, size_t all_expert_bytes, int64_t solo, const TeamTime& t) override {
    expert_bytes_read += expert_bytes;
    expert_weight_bytes = all_expert_bytes;
    solo_switches += solo;
    team.runs += t.runs;
    team.wall_seconds += t.wall_seconds;
    team.busy_seconds += t.busy_seconds;
  }
};

struct Bench {
  Model& model;
  PassTotals& totals;
  double peak_flops;
  double peak_flops_f32;  // the limit of the Gated DeltaNet delta rule, which stays in FP32
  ReadBandwidthProbe& probe;
  int64_t first_added_token;  // random prompts use the ids below it: ordinary text
  std::mt19937 rng{1234};
  std::vector<float> logits;

  std::vector<BatchToken> sequence(int32_t slot, int64_t first_position, int64_t count) {
    std::uniform_int_distribution<int32_t> id(0, int32_t(first_added_token) - 1);
    std::vector<BatchToken> tokens;
    for (int64_t i = 0; i < count; ++i)
      tokens.push_back({id(rng), slot, int32_t(first_position + i), i == count - 1});
    return tokens;
  }

  // Runs passes of at most max_pass_tokens() and returns the seconds taken.
  double run(const std::vector<BatchToken>& tokens) {
    double start = now_seconds();
    const size_t step = size_t(model.max_pass_tokens());
    for (size_t begin = 0; begin < tokens.size(); begin += step) {
      size_t end = std::min(tokens.size(), begin + step);
      model.forward(std::span(tokens).subspan(begin, end - begin), logits.data());
    }
    return now_seconds() - start;
  }

  json profile_json(double seconds) const {
    json ops = json::array();
    double gemm_flops = 0, gemm_seconds = 0, attn_flops = 0, attn_seconds = 0;
    for (const auto& op : totals.ops) {
      ops.push_back({{"op", op.name},
                     {"seconds", op.seconds},
                     {"share", op.seconds / seconds},
                     {"flops", op.flops},
                     {"bytes", op.bytes}});
      if (op.is_gemm) gemm_flops += op.flops, gemm_seconds += op.seconds;
      if (op.name == "attention") attn_flops += op.flops, attn_seconds += op.seconds;
    }
    json out = {{"ops", ops}};
    // The GEMM-bound limit: the pass's matrix-product FLOPs at the tier's peak and nothing else.
    if (gemm_seconds > 0)
      out["gemm"] = {{"tflops", gemm_flops / gemm_seconds / 1e12},
                     {"fraction_of_peak", gemm_flops / gemm_seconds / peak_flops},
                     {"fraction_of_gemm_bound", gemm_flops / peak_flops / seconds},
                     {"share_of_time", gemm_seconds / seconds}};
    if (attn_seconds > 0)
      out["attention"] = {{"tflops", attn_flops / attn_seconds / 1e12},
                          {"fraction_of_peak", attn_flops / attn_seconds / peak_flops},
                          {"share_of_time", attn_seconds / seconds}};
    // A hybrid model's Gated DeltaNet work apart from its matrix products: the causal conv, the
    // gates, the delta rule (FP32, against the FP32 FMA peak) and the gated norm.
    double gdn_seconds = 0, delta_flops = 0, delta_seconds = 0;
    for (const auto& op : totals.ops) {
      if (op.name.rfind("gdn_", 0) == 0) gdn_seconds += op.seconds;
      if (op.name == "gdn_delta") delta_flops += op.flops, delta_seconds += op.seconds;
    }
    if (gdn_seconds > 0)
      out["gdn"] = {{"share_of_time", gdn_seconds / seconds},
                    {"delta_rule_gflops", delta_flops / delta_seconds / 1e9},
                    {"delta_rule_fraction_of_f32_peak", delta_flops / delta_seconds / peak_flops_f32},
                    {"delta_rule_share_of_time", delta_seconds / seconds}};
    return out;
  }

  // Where a decode step's time goes beside its weight stream: the matrix products (lm_head
  // apart), the other operations (attention, norms, RoPE, ...), the time between operations, and
  // the thread team: its fork-joins per step, the caller running alone outside them, and the
  // members' idle time inside them (waking, or waiting for the last share) as a share of all the
  // members' time.
  json step_breakdown(double seconds, int64_t steps) const {
    double products = 0, lm_head = 0, ops = 0;
    for (const auto& op : totals.ops) {
      ops += op.seconds;
      if (op.is_gemm) products += op.seconds;
      if (op.name == "lm_head") lm_head += op.seconds;
    }
    const double members = double(model.limits().threads);
    const TeamTime& t = totals.team;
    return {{"step_ms", seconds / double(steps) * 1e3},
            {"products_share", (products - lm_head) / seconds},
            {"lm_head_share", lm_head / seconds},
            {"other_ops_share", (ops - products) / seconds},
            {"between_ops_share", (seconds - ops) / seconds},
            {"team_runs_per_step", double(t.runs) / double(steps)},
            {"team_run_us", t.runs ? t.wall_seconds / double(t.runs) * 1e6 : 0.0},
            {"caller_alone_share", (seconds - t.wall_seconds) / seconds},
            {"members_idle_share", (members * t.wall_seconds - t.busy_seconds) / (members * seconds)}};
  }

  double bytes_read() const {
    double bytes = 0;
    for (const auto& op : totals.ops) bytes += op.bytes;
    return bytes;
  }

  // Commits a slot's KV pages for positions [0, end) before a hybrid model's slot is filled
  // from position 0 (writing KV rows outside a pass voids the slot's state, which the fill then
  // starts over), so that decode steps after the fill do not pay for new pages.
  void commit_kv(int32_t slot, int64_t end) {
    if (!model.has_recurrent_state()) return;
    std::vector<std::span<uint8_t>> ranges;
    model.kv_ranges(slot, 0, end, /*for_write=*/true, ranges);
  }

  json prefill(int64_t length, int64_t then_decode = 0) {
    model.release_kv(0, 0);
    if (then_decode) commit_kv(0, length + then_decode);
    auto tokens = sequence(0, 0, length);
    const MappedTableStatus table_before = model.mapped_table();
    totals.reset();
    double seconds = run(tokens);
    json row = {{"kind", "prefill"},
                {"tokens", length},
                {"seconds", seconds},
                {"tokens_per_s", double(length) / seconds},
                {"ttft_s", seconds}};
    row.update(profile_json(seconds));
    add_expert_figures(row, double(length), 1);
    add_table_figures(row, table_before);
    return row;
  }

  // A table read in place (the n-gram table): its resident share after the run, and the page
  // faults its gathers took per token during it.
  void add_table_figures(json& row, const MappedTableStatus& before) {
    if (before.bytes == 0) return;
    const MappedTableStatus after = model.mapped_table();
    const double tokens = double(std::max<uint64_t>(1, after.gathered_tokens - before.gathered_tokens));
    row["table_bytes"] = after.bytes;
    row["table_resident_share"] = double(after.resident_bytes) / double(after.bytes);
    row["table_major_faults_per_token"] = double(after.major_faults - before.major_faults) / tokens;
    row["table_minor_faults_per_token"] = double(after.minor_faults - before.minor_faults) / tokens;
  }

  // The machine's read bandwidth now. It swings by tens of percent within seconds in a VM with
  // neighbours. The pauses let both teams' workers stop spinning (2 ms) before the other runs.
  double read_bandwidth_now() {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    double bandwidth = probe.measure(3);
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    return bandwidth;
  }

  // `steps` decode passes of `batch` slots whose contexts already hold `context` positions.
  // Because the bandwidth swings, the run goes in kParts parts with a reading between each two:
  // a part is judged against the better of the readings just before and just after it, and
  // fraction_of_bandwidth is the median over the parts. The whole run against the better of the
  // first and last readings is fraction_of_bandwidth_whole_run.
  json decode(int64_t batch, int64_t context, int64_t steps, const char* label) {
    constexpr int64_t kParts = 8;
    const int64_t parts = std::min(steps, kParts);
    // Commit the KV pages the run will write before the clock starts. Decode meets a new page
    // (2 MiB per layer) once every 1024 positions of Qwen3-0.6B, and committing it costs far
    // more than a step; a run of 32 steps that starts on a page boundary would count it 30 times
    // too often.
    // (A hybrid model's slot continues only where its state ends: its caller committed the
    // pages before filling the context, with commit_kv.)
    if (!model.has_recurrent_state()) {
      std::vector<BatchToken> last_step;
      for (int32_t slot = 0; slot < batch; ++slot)
        last_step.push_back({0, slot, int32_t(context + steps - 1), true});
      model.forward(last_step, logits.data());
    }
    totals.reset();
    std::vector<std::vector<BatchToken>> step_tokens(static_cast<size_t>(steps));
    for (int64_t s = 0; s < steps; ++s)
      for (int32_t slot = 0; slot < batch; ++slot)
        step_tokens[size_t(s)].push_back({int32_t(s % 1000), slot, int32_t(context + s), true});
    std::vector<double> readings{read_bandwidth_now()}, part_seconds;
    std::vector<int64_t> part_steps;
    int64_t sleeps = 0;  // the workers' sleeps in the parts; not the pauses around the readings
    for (int64_t part = 0; part < parts; ++part) {
      const int64_t begin = steps * part / parts, end = steps * (part + 1) / parts;
      rusage usage_before{}, usage_after{};
      getrusage(RUSAGE_SELF, &usage_before);
      double start = now_seconds();
      for (int64_t s = begin; s < end; ++s) model.forward(step_tokens[size_t(s)], logits.data());
      part_seconds.push_back(now_seconds() - start);
      getrusage(RUSAGE_SELF, &usage_after);
      sleeps += usage_after.ru_nvcsw - usage_before.ru_nvcsw;
      part_steps.push_back(end - begin);
      readings.push_back(read_bandwidth_now());
    }
    double seconds = 0;
    for (double t : part_seconds) seconds += t;
    const double bytes_per_step = bytes_read() / double(steps);
    std::vector<double> part_fractions, part_references;
    for (size_t i = 0; i < part_seconds.size(); ++i) {
      double reference = std::max(readings[i], readings[i + 1]);
      part_references.push_back(reference);
      part_fractions.push_back(bytes_per_step * double(part_steps[i]) / part_seconds[i] / reference);
    }
    const double whole_run_reference = std::max(readings.front(), readings.back());
    std::vector<double> readings_gbs;
    for (double r : readings) readings_gbs.push_back(r / 1e9);
    const double achieved = bytes_per_step * double(steps) / seconds;
    json row = {{"kind", label},
                {"batch", batch},
                {"context", context},
                {"tokens_per_s", double(batch * steps) / seconds},
                {"bytes_per_step", bytes_per_step},
                {"achieved_bandwidth_gbs", achieved / 1e9},
                {"read_bandwidth_gbs", median(part_references) / 1e9},
                {"fraction_of_bandwidth", median(part_fractions)},
                {"fraction_of_bandwidth_whole_run", achieved / whole_run_reference},
                {"part_fractions_of_bandwidth", part_fractions},
                {"part_read_bandwidths_gbs", readings_gbs},
                // A thread that waits past its spin sleeps in the kernel: a system call per sleep.
                {"sleeps_per_step", double(sleeps) / double(steps)},
                // Times the team found a core shared (runqueue waits) and ran on one thread.
                {"solo_switches", totals.solo_switches}};
    row.update(profile_json(seconds));
    row["step"] = step_breakdown(seconds, steps);
    add_expert_figures(row, double(batch * steps), steps);
    return row;
  }

  // MoE: expert weight bytes read per token, and per pass as a share of all expert weights
  // (decode of one token should read top_k / num_experts of them).
  void add_expert_figures(json& row, double tokens, int64_t passes) const {
    if (totals.expert_weight_bytes == 0) return;
    const double bytes = double(totals.expert_bytes_read);
    row["expert_bytes_per_token"] = bytes / tokens;
    row["expert_share_read_per_pass"] = bytes / double(passes) / double(totals.expert_weight_bytes);
  }
};

// The lowest id of the tokenizer's added (special) tokens, or the vocabulary size when the folder
// has no tokenizer.
int64_t first_added_token(const std::string& model_path, const Model& model) {
  int64_t first = model.vocab_size();
  try {
    auto tokenizer = Tokenizer::load(model_path);
    for (int64_t id = 0; id < std::min(first, tokenizer->vocab_size()); ++id)
      if (tokenizer->is_added(int32_t(id))) return id;
  } catch (const Error&) {
  }
  return first;
}

// The row's kind, and its weights when the run had two.
std::string label(const json& r) {
  return r["kind"].get<std::string>() + (r.contains("weights") ? " " + r["weights"].get<std::string>() : "");
}

// A hybrid model's figures: its state beside its KV, the Gated DeltaNet share of each prefill
// with the delta rule's rate against the FP32 FMA peak, and each prompt length's rate against
// the shortest's (only one layer in four attends over the whole prompt).
void print_hybrid_prefill(const std::vector<json>& rows, const json& machine) {
  const json* shortest = nullptr;
  for (const json& r : rows) {
    if (r["kind"] != "prefill" || !r.contains("state_bytes_per_slot")) continue;
    if (!shortest || label(*shortest) != label(r)) {
      shortest = &r;
      std::printf("%s: recurrent state %.1f MiB per slot, KV %.1f KiB per token\n", label(r).c_str(),
                  r["state_bytes_per_slot"].get<double>() / (1 << 20),
                  r["kv_bytes_per_token"].get<double>() / 1024);
    }
    const int64_t tokens = r["tokens"];
    std::printf("  prefill %6lld: Gated DeltaNet %4.1f%% of the time, delta rule %4.1f%% at %.1f GFLOP/s = "
                "%.1f%% of the FP32 FMA peak (%.0f GFLOP/s)",
                (long long)tokens, 100 * r.value("/gdn/share_of_time"_json_pointer, 0.0),
                100 * r.value("/gdn/delta_rule_share_of_time"_json_pointer, 0.0),
                r.value("/gdn/delta_rule_gflops"_json_pointer, 0.0),
                100 * r.value("/gdn/delta_rule_fraction_of_f32_peak"_json_pointer, 0.0),
                machine["peak_flops_f32"].get<double>() / 1e9);
    if (&r != shortest)
      std::printf("; %.1f%% of the %lld-token rate", 100 * r["tokens_per_s"].get<double>() /
                                                          (*shortest)["tokens_per_s"].get<double>(),
                  (long long)(*shortest)["tokens"].get<int64_t>());
    std::printf("\n");
  }
}

// A model that reads a table in place (the n-gram table): per prefill, the table's resident share
// and the page faults per token its gathers took; the cold prefill against the warm one.
void print_table_prefill(const std::vector<json>& rows) {
  bool header = false;
  for (const json& r : rows) {
    if (!r.contains("table_bytes")) continue;
    if (!header) {
      std::printf("\n%-20s %7s %12s %10s %12s %12s %14s\n", "run", "tokens", "table GiB", "resident",
                  "major/token", "minor/token", "cold/warm time");
      header = true;
    }
    std::printf("%-20s %7lld %12.1f %9.2f%% %12.2f %12.2f %14s\n", r["kind"].get<std::string>().c_str(),
                (long long)r["tokens"].get<int64_t>(), r["table_bytes"].get<double>() / (1u << 30),
                100 * r["table_resident_share"].get<double>(), r["table_major_faults_per_token"].get<double>(),
                r["table_minor_faults_per_token"].get<double>(),
                r.contains("cold_seconds_over_warm")
                    ? (std::to_string(r["cold_seconds_over_warm"].get<double>()).substr(0, 4) + "x").c_str()
                    : "");
  }
}

void print_table(const std::vector<json>& rows, const json& machine) {
  std::printf("\nmachine: %s, %d threads, peak %.0f GFLOP/s (BF16), %.0f GFLOP/s (FP32 FMA), read bandwidth %.1f GB/s\n",
              machine["isa"].get<std::string>().c_str(), machine["threads"].get<int>(),
              machine["peak_flops"].get<double>() / 1e9, machine["peak_flops_f32"].get<double>() / 1e9,
              machine["read_bandwidth"].get<double>() / 1e9);
  for (const json& r : rows)
    if (r["kind"] == "vision_encode")
      std::printf("\nvision tower: a %s image, %lld patches -> %lld tokens, encoded in %.2f s: %.3f TFLOP/s, "
                  "%.1f%% of the BF16 peak\n",
                  r["image"].get<std::string>().c_str(), (long long)r["patches"].get<int64_t>(),
                  (long long)r["tokens"].get<int64_t>(), r["seconds"].get<double>(), r["tflops"].get<double>(),
                  100 * r["fraction_of_peak"].get<double>());
  std::printf("\n%-20s %7s %7s %10s %9s %12s %10s %12s %10s %10s\n", "run", "batch", "tokens", "tokens/s",
              "TTFT s", "GEMM TF/s", "GEMM %pk", "%GEMM-bound", "attn %time", "other %time");
  for (const json& r : rows) {
    if (r["kind"] != "prefill" && r["kind"] != "prefill_cold_table") continue;
    const double attention_share = r.value("/attention/share_of_time"_json_pointer, 0.0);
    std::printf("%-20s %7d %7lld %10.1f %9.3f %12.3f %9.1f%% %11.1f%% %9.1f%% %9.1f%%\n", label(r).c_str(), 1,
                (long long)r["tokens"].get<int64_t>(), r["tokens_per_s"].get<double>(),
                r["ttft_s"].get<double>(), r.value("/gemm/tflops"_json_pointer, 0.0),
                100 * r.value("/gemm/fraction_of_peak"_json_pointer, 0.0),
                100 * r.value("/gemm/fraction_of_gemm_bound"_json_pointer, 0.0), 100 * attention_share,
                100 * (1 - r.value("/gemm/share_of_time"_json_pointer, 0.0) - attention_share));
  }
  print_hybrid_prefill(rows, machine);
  print_table_prefill(rows);
  std::printf("\n%-20s %7s %7s %10s %12s %10s %10s %10s %10s\n", "run", "batch", "context",
              "tokens/s", "MB/step", "GB/s", "read GB/s", "% of read", "whole run");
  for (const json& r : rows) {
    if (r["kind"] == "prefill" || r["kind"] == "prefill_cold_table" || r["kind"] == "vision_encode") continue;
    std::printf("%-20s %7lld %7lld %10.1f %12.1f %10.1f %10.1f %9.1f%% %9.1f%%\n",
                label(r).c_str(), (long long)r["batch"].get<int64_t>(),
                (long long)r["context"].get<int64_t>(), r["tokens_per_s"].get<double>(),
                r["bytes_per_step"].get<double>() / 1e6, r["achieved_bandwidth_gbs"].get<double>(),
                r["read_bandwidth_gbs"].get<double>(), 100 * r["fraction_of_bandwidth"].get<double>(),
                100 * r["fraction_of_bandwidth_whole_run"].get<double>());
  }
  for (const json& r : rows)
    if (r.contains("kv_committed_bytes"))
      std::printf("KV at context %lld: %.1f MiB committed, %.1f MiB needed (%lld bytes per token, %s)\n",
                  (long long)r["context"].get<int64_t>(), r["kv_committed_bytes"].get<double>() / 1048576,
                  r["kv_needed_bytes"].get<double>() / 1048576, (long long)r["kv_bytes_per_token"].get<int64_t>(),
                  r["kv_cache_dtype"].get<std::string>().c_str());
  for (const json& r : rows) {
    if (!r.contains("expert_bytes_per_token")) continue;
    std::string what = r.contains("tokens") ? std::to_string(r["tokens"].get<int64_t>()) + " tokens"
                                            : "batch " + std::to_string(r["batch"].get<int64_t>());
    std::printf("MoE %-19s %-12s expert weights read: %.1f MB per token, %.1f%% of all experts per pass\n",
                label(r).c_str(), what.c_str(),
                r["expert_bytes_per_token"].get<double>() / 1e6,
                100 * r["expert_share_read_per_pass"].get<double>());
  }
  std::printf("\ntime split by operation:\n");
  for (const json& r : rows) {
    if (!r.contains("ops")) continue;
    std::string name =
        label(r) +
        (r.contains("tokens") ? " " + std::to_string(r["tokens"].get<int64_t>())
                              : " b" + std::to_string(r["batch"].get<int64_t>()) + " ctx " +
                                    std::to_string(r["context"].get<int64_t>()));
    std::printf("  %-24s", name.c_str());
    for (const json& op : r["ops"])
      if (op["share"].get<double>() >= 0.005)
        std::printf(" %s %.0f%%", op["op"].get<std::string>().c_str(),
                    100 * op["share"].get<double>());
    std::printf("\n");
  }
  std::printf("\ndecode step beside its weight stream (products: the layers' matrix products; members idle:\n"
              "their time inside the team's runs spent waking or waiting for the last share, of all their time):\n");
  for (const json& r : rows) {
    if (!r.contains("step")) continue;
    const json& s = r["step"];
    const std::string name = label(r) + " b" + std::to_string(r["batch"].get<int64_t>()) + " ctx " +
                             std::to_string(r["context"].get<int64_t>());
    std::printf("  %-24s %.2f ms: products %.0f%%, lm_head %.0f%%, other ops %.0f%%, between ops %.0f%%; "
                "%.0f team runs (%.1f us each), caller alone %.0f%%, members idle %.0f%%\n",
                name.c_str(), s["step_ms"].get<double>(), 100 * s["products_share"].get<double>(),
                100 * s["lm_head_share"].get<double>(), 100 * s["other_ops_share"].get<double>(),
                100 * s["between_ops_share"].get<double>(), s["team_runs_per_step"].get<double>(),
                s["team_run_us"].get<double>(), 100 * s["caller_alone_share"].get<double>(),
                100 * s["members_idle_share"].get<double>());
  }
}

// The FP8 or INT4 rows (`quantised`: fp8, int4/int8, int4/bf16) beside the BF16 rows of the same
// run: decode tokens/s and bytes per step at batch 1, their ratios (targets: decode >= 85% of the
// read bandwidth, its tokens/s ratio >= 90% of the byte ratio), batch 4 over batch 1 (>= 3x), and
// prefill at each length (FP8: >= 90% of BF16; INT4 on VNNI tiers: >= 1.3x).
void compare_weights(const std::vector<json>& rows, const std::string& quantised,
                     const std::function<void(json)>& emit) {
  auto find = [&](const std::string& weights, const std::string& kind, const char* key,
                  int64_t value) -> const json* {
    for (const json& r : rows)
      if (r.value("weights", "") == weights && r["kind"] == kind && r.contains(key) &&
          r[key].get<int64_t>() == value && (kind != "decode_context" || r["batch"] == 1))
        return &r;
    return nullptr;
  };
  std::string name = quantised;
  for (char& c : name) c = char(std::toupper(c));
  const char* q = name.c_str();
  std::printf("\n%s beside BF16 (same run, same read probe):\n", q);
  const json *bf16_b1 = find("bf16", "decode", "batch", 1), *q_b1 = find(quantised, "decode", "batch", 1);
  if (bf16_b1 && q_b1) {
    const double speed = (*q_b1)["tokens_per_s"].get<double>() / (*bf16_b1)["tokens_per_s"].get<double>();
    const double bytes = (*bf16_b1)["bytes_per_step"].get<double>() / (*q_b1)["bytes_per_step"].get<double>();
    const double fraction = (*q_b1)["fraction_of_bandwidth"].get<double>();
    std::printf("  decode batch 1: BF16 %.1f tok/s (%.0f MB/step, %.1f%% of read), %s %.1f tok/s "
                "(%.0f MB/step, %.1f%% of read)\n",
                (*bf16_b1)["tokens_per_s"].get<double>(), (*bf16_b1)["bytes_per_step"].get<double>() / 1e6,
                100 * (*bf16_b1)["fraction_of_bandwidth"].get<double>(), q,
                (*q_b1)["tokens_per_s"].get<double>(), (*q_b1)["bytes_per_step"].get<double>() / 1e6,
                100 * fraction);
    std::printf("  tokens/s ratio %s/BF16 %.2f, byte ratio BF16/%s %.2f: %.1f%% of the byte ratio "
                "(target >= 90%%); %s at %.1f%% of read bandwidth (target >= 85%%)\n",
                q, speed, q, bytes, 100 * speed / bytes, q, 100 * fraction);
    emit({{"kind", quantised + "_vs_bf16_decode"}, {"tokens_per_s_ratio", speed}, {"byte_ratio", bytes},
          {"speed_over_byte_ratio", speed / bytes}, {quantised + "_fraction_of_bandwidth", fraction}});
  }
  for (const std::string& weights : {std::string("bf16"), quantised}) {
    const json *b1 = find(weights, "decode", "batch", 1), *b4 = find(weights, "decode", "batch", 4);
    if (!b1 || !b4) continue;
    const double ratio = (*b4)["tokens_per_s"].get<double>() / (*b1)["tokens_per_s"].get<double>();
    std::printf("  %s decode batch 4 / batch 1: %.2fx (target >= 3x)\n", weights.c_str(), ratio);
    emit({{"kind", "batch4_over_batch1"}, {"weights", weights}, {"ratio", ratio}});
  }
  for (const json& r : rows) {
    if (r["kind"] != "prefill" || r.value("weights", "") != "bf16") continue;
    const int64_t tokens = r["tokens"];
    const json* other = find(quantised, "prefill", "tokens", tokens);
    if (!other) continue;
    const double ratio = (*other)["tokens_per_s"].get<double>() / r["tokens_per_s"].get<double>();
    std::printf("  prefill %lld: BF16 %.1f tok/s, %s %.1f tok/s: %.1f%%%s\n", (long long)tokens,
                r["tokens_per_s"].get<double>(), q, (*other)["tokens_per_s"].get<double>(),
                100 * ratio, quantised == "fp8" ? " (target >= 90%)" : " (target >= 130% on VNNI tiers)");
    emit({{"kind", quantised + "_vs_bf16_prefill"}, {"tokens", tokens}, {"ratio", ratio}});
  }
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  CLI::App app{"ellm bench: the machine's limits and the engine's prefill/decode speed"};
  std::string model_path, prompt_lengths = "512,2048,8192,32768", batches = "1,4",
                          contexts = "8192,32768", json_path;
  int threads = 0;
  int64_t steps = 32;
  bool busy = true, zero_context = false;
  std::string image_size = "1280x720";
  app.add_option("--model-path", model_path, "model folder")->required();
  app.add_option("--threads", threads, "worker threads (default: one per physical core)");
  app.add_option("--prompt-lengths", prompt_lengths, "prefill lengths, comma-separated");
  app.add_option("--decode-batches", batches, "decode batch sizes at short context");
  app.add_option("--decode-contexts", contexts, "decode at these context lengths (batch 1)");
  app.add_flag("--zero-context", zero_context,
               "decode at a context length over a zeroed KV cache instead of prefilling it first "
               "(a hybrid model's recurrent state zeroed too; the same bytes read and work done; "
               "saves the long prefill)");
  app.add_option("--decode-steps", steps, "decode steps per measurement");
  app.add_option("--busy", busy, "also measure decode with another process busy on one core");
  app.add_option("--json", json_path, "also write the JSON lines to this file");
  app.add_option("--image-size", image_size,
                 "WIDTHxHEIGHT of the image a model with a vision tower encodes once (\"\" = none)")
      ->capture_default_str();
  add_quantize_option(app);
  add_mlock_table_option(app);
  add_rope_scaling_option(app);
  add_kv_cache_dtype_option(app);
  std::string activations = "auto";
  app.add_option("--activations", activations,
                 "inputs of INT4 products, comma-separated to run each: bf16, int8, auto (int8 "
                 "where the CPU has VNNI; on AVX2 without it the faster, timed at load)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const RopeScaling rope_scaling = rope_scaling_requested(app);
  const KvDtype kv_dtype = kv_cache_dtype_requested(app);
  if (threads <= 0) threads = physical_core_count();
  std::unique_ptr<BusyProcess> busy_process;
  if (busy) busy_process = std::make_unique<BusyProcess>();  // while this process is small
  std::vector<int64_t> lengths = parse_list(prompt_lengths), batch_list = parse_list(batches),
                       context_list = parse_list(contexts);

  json machine;
  {
    ThreadTeam team(threads, /*pin=*/true, /*adaptive=*/false);
    machine = {{"kind", "machine"},
               {"isa", isa_name(active_isa())},
               {"threads", threads},
               {"peak_flops", measure_peak_flops(team)},
               {"peak_flops_f32", measure_peak_flops_f32(team)},
               {"read_bandwidth", measure_read_bandwidth(team)}};
  }
  std::printf("%s\n", machine.dump().c_str());
  std::fflush(stdout);

  int64_t longest = 64;
  for (int64_t l : lengths) longest = std::max(longest, l);
  for (int64_t c : context_list) longest = std::max(longest, c);
  ServingLimits limits;
  limits.sequence_length = longest + steps + 8;
  limits.batch_size = 1;
  for (int64_t b : batch_list) limits.batch_size = std::max(limits.batch_size, b);
  limits.chunk_size = longest;
  limits.threads = threads;
  limits.lock_mapped_table = mlock_table_requested(app);
  limits.rope_scaling = rope_scaling;
  limits.kv_dtype = kv_dtype;
  limits.attention_bf16_products = attention_bf16_requested(app);
  // Its own team and buffer, made before the model takes the memory.
  ThreadTeam probe_team(threads, /*pin=*/true, /*adaptive=*/false);
  ReadBandwidthProbe probe(probe_team, read_probe_bytes());
  std::vector<json> rows;
  auto emit = [&](json row) {
    std::printf("%s\n", row.dump().c_str());
    std::fflush(stdout);
    rows.push_back(std::move(row));
  };
  // With --quantize fp8 the whole run twice, the checkpoint as stored (BF16) and then quantised;
  // with int4 three times, BF16, FP8 and INT4 (once for each --activations): one model at a
  // time, the same shape, machine and probe, for the comparisons at the end.
  std::vector<std::string> quantize_runs = {"none"};
  if (quantize_fp8_requested(app) || quantize_int4_requested(app)) quantize_runs.push_back("fp8");
  if (quantize_int4_requested(app)) quantize_runs.push_back("int4");
  std::vector<ActivationDtype> activation_runs;
  {
    std::stringstream list(activations);
    for (std::string item; std::getline(list, item, ',');) {
      if (item != "auto" && item != "bf16" && item != "int8")
        fail("--activations", "'" + item + "' is not bf16, int8 or auto");
      activation_runs.push_back(item == "bf16"   ? ActivationDtype::bf16
                                : item == "int8" ? ActivationDtype::int8
                                                 : ActivationDtype::automatic);
    }
    if (activation_runs.empty()) fail("--activations", "empty list");
  }
  const std::string& method = load_model_config(model_path).quant_method;
  struct Run {
    std::string quantize;
    ActivationDtype activations;
  };
  std::vector<Run> runs;
  for (const std::string& quantize : quantize_runs) {
    const bool int4 = quantize == "int4" || (quantize == "none" && (method == "gptq" || method == "awq"));
    for (size_t a = 0; a < (int4 ? activation_runs.size() : 1); ++a)
      runs.push_back({quantize, int4 ? activation_runs[a] : ActivationDtype::automatic});
  }
  std::vector<std::string> labels;
  for (const Run& run : runs) {
    limits.quantize_fp8 = run.quantize == "fp8";
    limits.quantize_int4 = run.quantize == "int4";
    limits.activations = run.activations;
    auto model = Model::load(model_path, limits);
    const std::string stored = run.quantize != "none" ? run.quantize
                               : method == "fp8"       ? "fp8"
                               : method == "gptq" || method == "awq" ? "int4"
                                                                     : "bf16";
    // INT4 rows name their activations: int4/int8, int4/bf16.
    const std::string weights =
        stored != "int4" ? stored
                         : stored + (model->limits().activations == ActivationDtype::int8 ? "/int8" : "/bf16");
    if (std::find(labels.begin(), labels.end(), weights) != labels.end()) continue;
    labels.push_back(weights);
    PassTotals totals;
    model->set_profile_sink(&totals);

    Bench bench{*model, totals, machine["peak_flops"], machine["peak_flops_f32"], probe,
                first_added_token(model_path, *model)};
    // One row per token that wants logits: the last of a prefill, each slot's in decode. (A row for
    // every token of a 32k pass would be 20 GB for Qwen3's vocabulary.)
    bench.logits.resize(size_t(limits.batch_size * model->vocab_size()));
    auto emit_run = [&](json row) {
      row["weights"] = weights;
      row["weight_bytes"] = model->weight_bytes();
      row["kv_bytes_per_token"] = model->kv_bytes_per_token();
      row["kv_cache_dtype"] = kv_dtype_name(model->limits().kv_dtype);
      row["attention_products"] = model->bf16_attention_products() ? "bf16" : "fp32";
      if (model->has_recurrent_state()) row["state_bytes_per_slot"] = model->state_bytes_per_slot();
      emit(std::move(row));
    };
    bench.run(bench.sequence(0, 0, 64));  // warm-up: commit buffers, fault in pages
    if (model->image_token_id() >= 0 && !image_size.empty()) {
      const size_t x = image_size.find('x');
      if (x == std::string::npos) fail("--image-size", "expected WIDTHxHEIGHT, e.g. 1280x720");
      emit_run(bench_vision_encode(*model, model_path, std::stoll(image_size.substr(0, x)),
                               std::stoll(image_size.substr(x + 1)), machine["peak_flops"]));
    }
    const int64_t short_context = 64;
    for (int64_t batch : batch_list) {
      for (int32_t slot = 0; slot < batch; ++slot) {
        bench.commit_kv(slot, short_context + steps);
        bench.run(bench.sequence(slot, 0, short_context));
      }
      emit_run(bench.decode(batch, short_context, steps, "decode"));
    }
    if (busy && !busy_process->ready())
      std::fprintf(stderr, "warning: could not start the busy process; no decode_busy row\n");
    if (busy && busy_process->ready()) {
      if (model->has_recurrent_state()) bench.run(bench.sequence(0, 0, short_context));  // from its start
      busy_process->start();
      emit_run(bench.decode(1, short_context, steps, "decode_busy"));
      busy_process->stop();
    }
    // Prefill each length into slot 0; a decode context equal to a prefill length reuses it.
    std::vector<int64_t> all_lengths = lengths;
    for (int64_t c : context_list)
      if (std::find(lengths.begin(), lengths.end(), c) == lengths.end()) all_lengths.push_back(c);
    std::sort(all_lengths.begin(), all_lengths.end());
    for (int64_t length : all_lengths) {
      bool wanted = std::find(lengths.begin(), lengths.end(), length) != lengths.end();
      bool context = std::find(context_list.begin(), context_list.end(), length) != context_list.end();
      // A hybrid model's recurrent state starts afresh at the one token run at the context's end:
      // its decode steps read and write the same state bytes whatever its values.
      const bool zeros = zero_context;
      if (wanted || !zeros) {
        json row = bench.prefill(length, context ? steps : 0);
        if (wanted) emit_run(row);
      } else {  // decode over a zeroed cache: the same bytes and instructions
        model->release_kv(0, 0);
        if (model->has_recurrent_state()) {  // as if a snapshot of a zero state were restored there
          std::vector<std::span<uint8_t>> state;
          model->state_ranges(0, /*for_write=*/true, state);
          for (std::span<uint8_t> range : state) std::memset(range.data(), 0, range.size());
          model->set_state_end(0, length - 1);
        }
        bench.run(bench.sequence(0, length - 1, 1));  // commits the cache before the clock starts
      }
      if (context) {
        json row = bench.decode(1, length, steps, "decode_context");
        row["context_filled_by"] = wanted || !zeros ? "prefill" : "zeros";
        // The KV the slot holds against what its positions need (bytes per token x context).
        row["kv_committed_bytes"] = model->kv_resident_bytes();
        row["kv_needed_bytes"] = double(model->kv_bytes_per_token()) * double(length);
        emit_run(row);
      }
    }
    // A table read in place: a prefill with the table warm, then with its pages dropped from
    // memory (as after a restart or under memory pressure), when the run prefills.
    if (model->mapped_table().bytes > 0 && !lengths.empty()) {
      const int64_t length = std::find(lengths.begin(), lengths.end(), 2048) != lengths.end() ? 2048 : lengths.front();
      const json warm = bench.prefill(length);
      model->evict_mapped_table();
      json cold = bench.prefill(length);
      cold["kind"] = "prefill_cold_table";
      cold["warm_tokens_per_s"] = warm["tokens_per_s"];
      cold["cold_seconds_over_warm"] = double(cold["seconds"]) / double(warm["seconds"]);
      emit_run(cold);
    }
  }
  print_table(rows, machine);
  if (std::find(labels.begin(), labels.end(), "bf16") != labels.end())
    for (const std::string& weights : labels)
      if (weights != "bf16") compare_weights(rows, weights, emit);
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) fail(json_path, "cannot write");
    std::fprintf(f, "%s\n", machine.dump().c_str());
    for (const json& r : rows) std::fprintf(f, "%s\n", r.dump().c_str());
    std::fclose(f);
  }
  return 0;
}

}  // namespace ellm
