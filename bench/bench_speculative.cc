// Speculative decoding (issue 33), through the engine at batch 1. Random weights keep nothing
// a proposer offers, so the mechanism is measured apart from acceptance:
//
//   mechanism  proposals that are always right, for k = 2, 4, 8:
//              - free proposals: the prompt holds the continuation (text of the file) and the
//                model "copies" it (--scripted-output's hook), so prompt lookup proposes
//                exactly what is chosen; the passes are real, only the choice is scripted.
//                Against plain decoding of the same script at the same context.
//              - a draft model identical to the model: real greedy decoding, every proposal
//                kept (rows are batch invariant), the draft's passes paid for in full; its
//                time proposing is reported, and the tokens/s without it.
//   rollback   (hybrid models) what rolling back a cut group costs, against keeping a state per
//              position of the group
//   edit       prompt lookup on an edit workload: a file in the prompt (2,000 tokens), the
//              output that file with a few edits (scripted), against plain decoding.
//
// Figures: decode tokens/s (first token to last, wall), CPU seconds per token (the process: the
// engine thread and the team), tokens per pass, the share of proposals kept.
//
//   bench_speculative --model DIR [--draft DIR] [--tokens N] [--ks 2,4,8] [--file PATH]
//                     [--file-tokens 2000] [--copy-tokens 512] [--threads N]
//                     [--sections mechanism,free,edit,rollback]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "base/error.h"
#include "base/threads.h"
#include "engine/engine.h"
#include "model/config.h"
#include "model/memory/state_rollback.h"
#include "model/model.h"
#include "text/tokenizer/tokenizer.h"

namespace {

using namespace ellm;

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

struct Run {
  std::vector<int32_t> ids;
  double decode_seconds = 0, cpu = 0;
  int64_t tokens = 0;  // generated after the first
  EngineMetrics::Speculative spec;  // this run's
  double tokens_per_second() const { return double(tokens) / decode_seconds; }
};

// One request, timed from its first token to its end.
Run run(Engine& engine, GenerateRequest request, Proposer proposer) {
  const EngineMetrics before = engine.metrics();
  auto stream = engine.submit(request);
  Run r;
  std::chrono::steady_clock::time_point first;
  double cpu_first = 0;
  for (;;) {
    auto event = stream->next(3600 * 1000);
    if (!event) throw Error("bench: the stream went quiet");
    if (!event->ids.empty() && r.ids.empty()) {
      first = std::chrono::steady_clock::now();
      cpu_first = cpu_seconds();
      r.ids.insert(r.ids.end(), event->ids.begin(), event->ids.end());
      r.tokens = int64_t(r.ids.size()) - 1;
      continue;
    }
    r.ids.insert(r.ids.end(), event->ids.begin(), event->ids.end());
    if (event->finished) break;
  }
  r.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - first).count();
  r.cpu = cpu_seconds() - cpu_first;
  r.tokens = int64_t(r.ids.size()) - 1;
  const EngineMetrics after = engine.metrics();
  const auto& a = after.speculative[int(proposer)];
  const auto& b = before.speculative[int(proposer)];
  r.spec = {a.checks - b.checks, a.proposed - b.proposed, a.accepted - b.accepted,
            a.propose_seconds - b.propose_seconds};
  return r;
}

void print_row(const char* what, int k, const Run& r, const Run& base) {
  // Each step emits one token plus the proposals it kept: tokens / steps per pass.
  const double passes = double(r.tokens + 1 - r.spec.accepted);
  std::printf("%-34s k=%d  %7.2f tok/s  %5.2fx  %6.1f ms CPU/token  %5.2f tokens/pass  kept %5.1f%% (%lld of %lld)",
              what, k, r.tokens_per_second(), r.tokens_per_second() / base.tokens_per_second(),
              1e3 * r.cpu / double(r.tokens), double(r.tokens + 1) / passes,
              r.spec.proposed ? 100.0 * double(r.spec.accepted) / double(r.spec.proposed) : 0.0,
              static_cast<long long>(r.spec.accepted), static_cast<long long>(r.spec.proposed));
  if (r.spec.propose_seconds > 0.01)
    std::printf("  proposing %.2f s; without it %.2f tok/s (%.2fx)", r.spec.propose_seconds,
                double(r.tokens) / (r.decode_seconds - r.spec.propose_seconds),
                double(r.tokens) / (r.decode_seconds - r.spec.propose_seconds) / base.tokens_per_second());
  std::printf("\n");
  std::fflush(stdout);
}

void print_base(const char* what, const Run& r) {
  std::printf("%-34s      %7.2f tok/s  1.00x  %6.1f ms CPU/token\n", what, r.tokens_per_second(),
              1e3 * r.cpu / double(r.tokens));
  std::fflush(stdout);
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoi(item));
  return out;
}

// A hybrid model's rollback of a group of k + 1 tokens (model/memory/state_rollback.h) against keeping a
// state per position of the group: the state copy every group costs, and the replay of the
// kept tokens a cut group costs, against k + 1 state copies.
void rollback_costs(const ModelConfig& c, int k, int threads, double decode_ms) {
  int64_t layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) layers += c.is_linear_layer(l);
  const RecurrentShape shape{layers, c.linear_conv_kernel_dim, c.conv_dim(), c.linear_num_key_heads,
                             c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim};
  RecurrentState state(shape, 1);
  StateRollback rollback(shape, 1, k + 1);
  ThreadTeam team(threads > 0 ? threads : physical_core_count());
  const size_t bytes = state.bytes_per_slot();
  std::vector<uint8_t> copies(bytes * size_t(k + 1));
  auto time_ms = [](auto&& fn) {
    double best = 1e30;
    for (int round = 0; round < 5; ++round) {
      const auto start = std::chrono::steady_clock::now();
      fn();
      best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
  };
  const double save = time_ms([&] { rollback.save(state, 0); });
  const double replay_one = time_ms([&] { rollback.restore(state, 0, 1, team); });
  const double replay_all = time_ms([&] { rollback.restore(state, 0, k, team); });
  const double per_position = time_ms([&] {
    for (int t = 0; t <= k; ++t) std::memcpy(copies.data() + size_t(t) * bytes, state.conv(0, 0), bytes);
  });
  std::printf("\n== rollback of a group of %d tokens: recurrent state %.1f MiB (%lld Gated DeltaNet layers), "
              "decode step %.1f ms (0: not measured)\n", k + 1, double(bytes) / (1 << 20),
              static_cast<long long>(layers), decode_ms);
  auto row = [&](const std::string& what, double ms) {
    std::printf("%-44s %7.2f ms  (%4.1f%% of a decode step)\n", what.c_str(), ms, decode_ms > 0 ? 100 * ms / decode_ms : 0.0);
  };
  row("state copied before each group", save);
  row("cut group: restore + replay of 1 token", replay_one);
  row("cut group: restore + replay of " + std::to_string(k) + " tokens", replay_all);
  row("instead, a state per position (" + std::to_string(k + 1) + " copies)", per_position);
  std::fflush(stdout);
}

GenerateRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens, const char* proposer, int k) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  r.speculative = proposer;
  r.num_speculative_tokens = k;
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string model_dir, draft_dir, file = ELLM_SOURCE_DIR "/src/engine/session_store.cc";
  int64_t tokens = 128, file_tokens = 2000, copy_tokens = 512;
  int threads = 0;
  std::vector<int> ks = {2, 4, 8};
  std::string sections = "mechanism,free,edit,rollback";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") model_dir = value;
    else if (flag == "--draft") draft_dir = value;
    else if (flag == "--tokens") tokens = std::stoll(value);
    else if (flag == "--ks") ks = parse_list(value);
    else if (flag == "--file") file = value;
    else if (flag == "--file-tokens") file_tokens = std::stoll(value);
    else if (flag == "--copy-tokens") copy_tokens = std::stoll(value);
    else if (flag == "--threads") threads = std::stoi(value);
    else if (flag == "--sections") sections = value;
    else throw Error("bench_speculative: unknown flag " + flag);
  }
  if (model_dir.empty()) throw Error("usage: bench_speculative --model DIR [--draft DIR] [--tokens N] [--ks 2,4,8] "
                                     "[--file PATH] [--file-tokens N] [--copy-tokens N] [--threads N] "
                                     "[--sections mechanism,free,edit,rollback]");
  if (draft_dir.empty()) draft_dir = model_dir;
  int k_max = 0;
  for (int k : ks) k_max = std::max(k_max, k);

  auto tokenizer = Tokenizer::load(model_dir);
  std::ifstream in(file);
  if (!in) throw Error("bench_speculative: cannot read " + file);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> file_ids = tokenizer->encode(text.str());
  if (int64_t(file_ids.size()) < file_tokens) throw Error("bench_speculative: the file has fewer tokens than --file-tokens");
  if (file_tokens < 128 + tokens || copy_tokens > file_tokens || copy_tokens < 16)
    throw Error("bench_speculative: needs --file-tokens >= 128 + --tokens and 16 <= --copy-tokens <= --file-tokens");
  file_ids.resize(size_t(file_tokens));

  ServingLimits limits;
  limits.sequence_length = file_tokens + copy_tokens + 3 * tokens + 256;
  limits.batch_size = 1;
  limits.threads = threads;
  limits.speculative_tokens = k_max;
  auto wanted = [&](const char* section) { return sections.find(section) != std::string::npos; };
  std::unique_ptr<Model> model;
  EngineOptions options;
  options.num_speculative_tokens = k_max;
  options.speculative_pass_rows = k_max + 1;

  std::printf("bench_speculative: %s (draft %s), batch 1, load average %s\n", model_dir.c_str(),
              draft_dir.c_str(), load_average().c_str());

  double decode_ms = 0;  // plain decode, per token
  // Mechanism: a prompt from the file's start.
  const std::vector<int32_t> prompt(file_ids.begin(), file_ids.begin() + 128);
  if (wanted("mechanism")) {
    model = Model::load(model_dir, limits);
    auto draft = Model::load(draft_dir, limits, model.get());
    Engine engine(std::move(model), tokenizer, options, std::move(draft));
    std::printf("\n== mechanism: proposals always right, %lld tokens after a %zu-token prompt\n",
                static_cast<long long>(tokens), prompt.size());
    Run plain = run(engine, greedy(prompt, tokens, "none", 0), Proposer::none);
    print_base("plain decode", plain);
    decode_ms = 1e3 * plain.decode_seconds / double(plain.tokens);
    for (int k : ks)
      print_row("draft model = the model", k, run(engine, greedy(prompt, tokens, "draft", k), Proposer::draft), plain);
  }
  if (wanted("free")) {  // the script hook takes a second engine
    // The "answer" is the file's next tokens (real text: a random model's own output tends to
    // loop on a token or two).
    const std::vector<int32_t> answer(file_ids.begin() + 128, file_ids.begin() + 128 + tokens);
    model = Model::load(model_dir, limits);
    EngineOptions scripted = options;
    scripted.scripted_outputs = {answer};
    Engine engine(std::move(model), tokenizer, scripted);
    std::vector<int32_t> with_answer = prompt;
    with_answer.insert(with_answer.end(), answer.begin(), answer.end());
    Run plain = run(engine, greedy(with_answer, tokens, "none", 0), Proposer::none);
    print_base("plain decode (same context)", plain);
    if (decode_ms == 0) decode_ms = 1e3 * plain.decode_seconds / double(plain.tokens);
    for (int k : ks)
      print_row("free proposals (prompt lookup)", k, run(engine, greedy(with_answer, tokens, "ngram", k), Proposer::ngram), plain);
  }
  if (wanted("edit")) {
    // The edit workload: the file, then an edited copy of its first copy_tokens tokens.
    std::vector<int32_t> edited(file_ids.begin(), file_ids.begin() + copy_tokens);
    for (int64_t at : {copy_tokens / 8, copy_tokens / 3, copy_tokens / 2, 3 * copy_tokens / 4})
      edited[size_t(at)] = edited[size_t(at)] == 1000 ? 1001 : 1000;  // a changed word
    edited.insert(edited.begin() + copy_tokens / 5, {1234, 2345, 3456});  // three added
    edited.erase(edited.begin() + 2 * copy_tokens / 3, edited.begin() + 2 * copy_tokens / 3 + 2);  // two removed
    model = Model::load(model_dir, limits);
    EngineOptions scripted = options;
    scripted.scripted_outputs = {edited};
    Engine engine(std::move(model), tokenizer, scripted);
    std::vector<int32_t> request = tokenizer->encode("Apply the edits to this file and print it whole:\n");
    request.insert(request.end(), file_ids.begin(), file_ids.end());
    request.push_back(file_ids.front() == 198 ? 271 : 198);
    std::printf("\n== edit workload: a %lld-token file in the prompt, the output its first %lld tokens "
                "with 4 changed, 3 added, 2 removed\n",
                static_cast<long long>(file_tokens), static_cast<long long>(copy_tokens));
    const int64_t n = int64_t(edited.size()) + 1;
    Run plain = run(engine, greedy(request, n, "none", 0), Proposer::none);
    print_base("plain decode", plain);
    for (int k : ks)
      print_row("prompt lookup", k, run(engine, greedy(request, n, "ngram", k), Proposer::ngram), plain);
  }
  const ModelConfig config = load_model_config(model_dir);
  if (config.is_hybrid() && wanted("rollback")) rollback_costs(config, k_max, threads, decode_ms);
  std::printf("\nload average at the end %s\n", load_average().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
