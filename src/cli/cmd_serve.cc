// ellm serve: load a model folder, start the engine, serve the OpenAI/vLLM API until SIGTERM/SIGINT.
#include <cctype>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <thread>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/log.h"
#include "base/memory.h"
#include "cli/cli_images.h"
#include "cli/commands.h"
#include "cli/generation_config.h"
#include "engine/engine.h"
#include "model/config.h"
#include "model/model.h"
#include "model/rope.h"
#include "server/output_parser.h"
#include "server/server.h"
#include "text/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace ellm {

namespace {

// "8G", "512M", "64k", "1048576" -> bytes. Throws Error naming `what` on anything else.
size_t parse_byte_size(const std::string& text, const std::string& what) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) i++;
  std::string unit = text.substr(i);
  if (i == 0 || i > 15) throw Error(what + ": expected a size like 8G, 512M or 1048576, got '" + text + "'");
  size_t value = std::stoull(text.substr(0, i));
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (!unit.empty() && unit.back() == 'i') unit.pop_back();
  size_t scale = 1;
  if (unit.empty()) scale = 1;
  else if (unit == "k" || unit == "K") scale = size_t{1} << 10;
  else if (unit == "m" || unit == "M") scale = size_t{1} << 20;
  else if (unit == "g" || unit == "G") scale = size_t{1} << 30;
  else if (unit == "t" || unit == "T") scale = size_t{1} << 40;
  else throw Error(what + ": unknown size unit in '" + text + "' (use K, M, G or T)");
  return value * scale;
}

std::string folder_name(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "models/x/" -> "x"
  return p.filename().string();
}

std::vector<int32_t> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(item, &used);
    } catch (...) {
    }
    if (id < 0 || id > INT32_MAX || item.find_first_not_of(" \t", used) != std::string::npos)
      throw Error("serve --scripted-output: '" + item + "' is not a token id");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// "1,2;3,4": one script per request in turn, separated by ';'.
std::vector<std::vector<int32_t>> parse_scripts(const std::string& text) {
  std::vector<std::vector<int32_t>> scripts;
  std::stringstream in(text);
  std::string script;
  while (std::getline(in, script, ';')) scripts.push_back(parse_id_list(script));
  return scripts;
}

int g_signal_pipe[2] = {-1, -1};

void on_stop_signal(int sig) {
  unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &byte, 1);
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  CLI::App app{"OpenAI/vLLM-compatible HTTP server", "ellm serve"};
  std::string model_path, host = "0.0.0.0", served_name, api_key, chat_template_file, tool_parser;
  std::string kv_memory = "0", max_body = "32M", scripted, allowed_local_media_path;
  int64_t max_image_tokens = 0;
  double scripted_token_ms = 0;
  std::string session_memory, session_dir, session_disk, replica_id, speculative = "none", image_cache = "512M";
  int64_t num_speculative_tokens = -1;
  int64_t state_snapshot_interval = EngineOptions{}.state_snapshot_interval;
  int port = 8000, threads = 0;
  int64_t sequence_length = 0, batch_size = 4, chunk_size = 0, max_queue = 64;
  double shutdown_grace = 10, request_deadline = 60, write_timeout = 30, max_decode_stall_ms = 500;
  int max_connections = 512, max_per_client = 64;
  bool no_session_cache = false, strict_max_tokens = false, language_model_only = false;
  app.add_option("--model-path", model_path, "Hugging Face model folder")->required();
  app.add_option("--host", host, "address to listen on")->capture_default_str();
  app.add_option("--port", port, "port to listen on (0 = any free port)")->capture_default_str();
  app.add_option("--served-model-name", served_name, "model name clients use (default: the folder name)");
  app.add_option("--api-key", api_key, "require 'Authorization: Bearer KEY' on /v1 routes");
  app.add_option("--sequence-length", sequence_length,
                 "tokens per slot (default: 4096, or the model's window if smaller: max_position_embeddings, "
                 "or the original window times the YaRN factor)");
  app.add_option("--batch-size", batch_size, "slots: sequences generated at once")->capture_default_str();
  app.add_option("--chunk-size", chunk_size, "largest prefill pass (default: the sequence length, no chunking)");
  app.add_option("--threads", threads, "worker threads (default: one per physical core)");
  app.add_option("--max-queue", max_queue, "requests waiting for a slot before 429")->capture_default_str();
  app.add_option("--max-decode-stall-ms", max_decode_stall_ms,
                 "longest wait for the next token of generating requests while a long prompt prefills "
                 "(it then runs in parts, their decode steps in between; 0 = never split a prefill)")
      ->capture_default_str();
  app.add_option("--kv-memory", kv_memory,
                 "KV cache budget, e.g. 8G (default: the RAM left after the weights, --session-memory and "
                 "--image-cache, less a margin); a request that can never fit in it is refused");
  add_quantize_option(app);
  add_activations_option(app);
  add_mlock_table_option(app);
  add_rope_scaling_option(app);
  add_kv_cache_dtype_option(app);
  app.add_option("--chat-template", chat_template_file, "Jinja file replacing the model's chat template");
  app.add_option("--tool-call-parser", tool_parser, "hermes, qwen3_coder or none (default: from the template)");
  app.add_option("--max-body-size", max_body, "largest request body, e.g. 8M (images come inside it)")
      ->capture_default_str();
  app.add_option("--max-image-tokens", max_image_tokens,
                 "most image tokens one request may hold (0 = only the sequence length limits them)")
      ->capture_default_str();
  app.add_option("--image-cache", image_cache,
                 "RAM for the vision tower's rows of recent images, by content: a screenshot sent again after its "
                 "KV is gone is not encoded again (0 = none)")
      ->capture_default_str();
  app.add_flag("--language-model-only", language_model_only,
               "leave a vision-language checkpoint's vision tower unread: text only, as vLLM's flag");
  app.add_option("--allowed-local-media-path", allowed_local_media_path,
                 "folder whose images requests may name as file:// URLs (default: data: URIs only)");
  app.add_option("--shutdown-grace", shutdown_grace, "seconds in-flight requests get on SIGTERM")->capture_default_str();
  app.add_option("--max-connections", max_connections, "connections served at once (one thread each)")->capture_default_str();
  app.add_option("--max-connections-per-client", max_per_client,
                 "connections one client address may hold; more get 429 (0 = no cap; raise it behind a load balancer)")
      ->capture_default_str();
  app.add_option("--request-deadline", request_deadline, "seconds a request's header and body may take to arrive")
      ->capture_default_str();
  app.add_option("--write-timeout", write_timeout,
                 "seconds one write to a client (a response, or a chunk of a stream) may take")
      ->capture_default_str();
  app.add_flag("--no-session-cache", no_session_cache, "never reuse cached KV, and keep no session store");
  app.add_flag("--strict-max-tokens", strict_max_tokens,
               "refuse (400) a max_tokens beyond what the context leaves after the prompt, as vLLM and "
               "OpenAI do; by default the completion is shortened to fit and ends with finish_reason length");
  app.add_option("--session-memory", session_memory,
                 "RAM for sessions that left their slot, e.g. 4G (default: a quarter of RAM, at most 16G)");
  app.add_option("--session-dir", session_dir,
                 "directory for sessions beyond --session-memory; they survive restarts and may be shared by replicas (default: none)");
  app.add_option("--session-disk", session_disk, "disk budget of --session-dir, e.g. 100G (default: half the free space there)");
  app.add_option("--state-snapshot-interval", state_snapshot_interval,
                 "hybrid models (Qwen3.5+): a prompt's prefill keeps a snapshot of the recurrent state every this many "
                 "tokens, where a conversation sharing its start may resume (0: only at request ends and shared prefixes)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--replica-id", replica_id,
                 "this replica's name in /metrics (label replica) and the X-Ellm-Replica header (default: the hostname)");
  app.add_option("--speculative", speculative,
                 "speculative decoding: ngram (prompt lookup), mtp (the model's own head, Qwen3.5+), "
                 "draft:PATH (a small model of the same tokenizer) or none; requests may choose another")
      ->capture_default_str();
  app.add_option("--num-speculative-tokens", num_speculative_tokens,
                 "most tokens a stream proposes per pass (default 4 with --speculative; fewer while few are kept)");
  app.add_option("--scripted-token-ms", scripted_token_ms, "testing: wait this long before each scripted token");
  app.add_option("--scripted-output", scripted, "testing: comma-separated token ids emitted instead of sampling; several scripts separated by ';' serve the requests in turn, the last one repeating");
  try {
    // A flag given twice takes its last value, as in vLLM (and wrapper scripts rely on it).
    for (CLI::Option* option : app.get_options())
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  // A signal may land on any thread (worker teams exist before this runs), so the handler only
  // writes the signal number to a pipe; a watcher thread reads it and drains the server.
  if (pipe(g_signal_pipe) != 0) throw Error("serve: cannot create the signal pipe");
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client closing mid-write is an error return, not a kill

  std::atomic<Server*> live_server{nullptr};
  std::atomic<Engine*> live_engine{nullptr};
  std::atomic<bool> stopping{false}, stopped{false};
  std::thread signal_thread([&] {
    unsigned char sig = 0;
    while (read(g_signal_pipe[0], &sig, 1) != 1) {
    }
    Server* server = live_server.load();
    if (!server) std::_Exit(128 + sig);  // still loading: nothing to drain
    stopping.store(true);
    log_info(std::string("serve: ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + ", shutting down");
    const auto grace = std::chrono::milliseconds(static_cast<int64_t>(shutdown_grace * 1000));
    const auto deadline = std::chrono::steady_clock::now() + grace;
    server->shutdown(grace);
    // Then the sessions in slots and RAM go to --session-dir, within what is left of the grace
    // (at least a second, so a grace of 0 still saves small sessions).
    live_engine.load()->shutdown(std::max(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(1)));
    stopped.store(true);
  });
  signal_thread.detach();  // it may outlive an exception thrown while loading

  if (served_name.empty()) served_name = folder_name(model_path);
  ModelConfig config = load_model_config(model_path);
  const RopeScaling rope_scaling = rope_scaling_requested(app);
  apply_rope_scaling(config, rope_scaling);
  const int64_t window = config.context_window();
  if (sequence_length <= 0) sequence_length = window > 0 ? std::min<int64_t>(4096, window) : 4096;
  if (window > 0 && sequence_length > window)
    log_warn("serve: --sequence-length " + std::to_string(sequence_length) + " is beyond the model's window of " +
             std::to_string(window) + " positions (RoPE past it is extrapolated; see --rope-scaling)");
  if (batch_size < 1) throw Error("serve --batch-size: must be at least 1");
  if (max_queue < 0) throw Error("serve --max-queue: must not be negative");
  if (!(max_decode_stall_ms >= 0)) throw Error("serve --max-decode-stall-ms: must not be negative");

  ServingLimits limits;
  limits.sequence_length = sequence_length;
  limits.rope_scaling = rope_scaling;
  limits.batch_size = batch_size;
  limits.chunk_size = chunk_size;
  limits.threads = threads;
  limits.kv_memory_bytes = parse_byte_size(kv_memory, "serve --kv-memory");
  limits.kv_dtype = kv_cache_dtype_requested(app);
  limits.attention_bf16_products = attention_bf16_requested(app);
  limits.quantize_fp8 = quantize_fp8_requested(app);
  limits.quantize_int4 = quantize_int4_requested(app);
  limits.activations = activations_requested(app);
  limits.lock_mapped_table = mlock_table_requested(app);
  limits.language_model_only = language_model_only;
  const Proposer proposer = parse_proposer(speculative, "serve --speculative");
  if (num_speculative_tokens < 0) num_speculative_tokens = proposer == Proposer::none ? 0 : 4;
  limits.speculative_tokens = num_speculative_tokens;
  limits.mtp = proposer == Proposer::mtp;

  Server::check_address(host, port);
  auto tokenizer = Tokenizer::load(model_path);
  ChatTemplate chat_template = ChatTemplate::load(model_path, chat_template_file);
  GenerationDefaults defaults = load_generation_defaults(model_path);

  ServerOptions server_options;
  server_options.model_name = served_name;
  server_options.model_path = model_path;
  server_options.api_key = api_key;
  if (replica_id.empty()) {
    char name[256] = {};
    replica_id = gethostname(name, sizeof name - 1) == 0 && name[0] ? name : "ellm";
  }
  server_options.replica_id = replica_id;
  server_options.max_body_bytes = parse_byte_size(max_body, "serve --max-body-size");
  server_options.tool_call_format =
      tool_parser.empty() ? detect_tool_call_format(chat_template.source()) : tool_call_format_by_name(tool_parser);
  server_options.parse_reasoning = chat_template.source().find("</think>") != std::string::npos;
  if (max_connections < 1 || max_per_client < 0 || request_deadline <= 0 || write_timeout <= 0)
    throw Error("serve: --max-connections, --request-deadline and --write-timeout must be positive, "
                "--max-connections-per-client not negative");
  // At least one connection for every request that can be generating or queued, plus a few.
  server_options.connections.max_connections =
      static_cast<int>(std::max<int64_t>(max_connections, batch_size + max_queue + 8));
  server_options.connections.max_per_client = max_per_client;
  server_options.connections.request_deadline = std::chrono::milliseconds(static_cast<int64_t>(request_deadline * 1000));
  server_options.connections.write_timeout = std::chrono::milliseconds(static_cast<int64_t>(write_timeout * 1000));

  EngineOptions engine_options;
  engine_options.max_queue = max_queue;
  engine_options.max_decode_stall_seconds = max_decode_stall_ms / 1000;
  engine_options.session_cache = !no_session_cache;
  engine_options.strict_max_tokens = strict_max_tokens;
  engine_options.session_memory_bytes =
      session_memory.empty() ? std::min<size_t>(physical_memory_bytes() / 4, size_t(16) << 30)
                             : parse_byte_size(session_memory, "serve --session-memory");
  engine_options.session_dir = session_dir;
  engine_options.image_cache_bytes = parse_byte_size(image_cache, "serve --image-cache");
  engine_options.state_snapshot_interval = state_snapshot_interval;
  if (!session_disk.empty()) {
    engine_options.session_disk_bytes = parse_byte_size(session_disk, "serve --session-disk");
  } else if (!session_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(session_dir, ec);
    auto space = std::filesystem::space(session_dir, ec);
    if (!ec) engine_options.session_disk_bytes = space.available / 2;
  }
  engine_options.eos_token_ids = defaults.eos_token_ids;
  engine_options.default_sampling = defaults.sampling;
  if (!scripted.empty()) engine_options.scripted_outputs = parse_scripts(scripted);
  engine_options.scripted_token_seconds = scripted_token_ms / 1000;
  engine_options.speculative = proposer;
  engine_options.num_speculative_tokens = num_speculative_tokens;

  // The automatic KV budget (no --kv-memory) leaves the session store's and the image cache's RAM.
  limits.ram_reserved_bytes = engine_options.session_memory_bytes + engine_options.image_cache_bytes;
  std::unique_ptr<Model> model = Model::load(model_path, limits);
  std::unique_ptr<Model> draft;
  if (proposer == Proposer::draft) {
    const std::string draft_path = speculative.substr(std::string("draft:").size());
    if (draft_path.empty()) throw Error("serve --speculative draft:PATH: the path of the draft model is missing");
    ServingLimits draft_limits = limits;  // as stored; its KV is its own, beside the budget
    draft_limits.mtp = draft_limits.quantize_fp8 = draft_limits.quantize_int4 = false;
    draft_limits.kv_memory_bytes = 0;
    draft = Model::load(draft_path, draft_limits, model.get());
  }
  Engine engine(std::move(model), tokenizer, engine_options, std::move(draft));
  if (max_image_tokens < 0) throw Error("serve --max-image-tokens must not be negative");
  server_options.max_image_tokens = max_image_tokens;
  server_options.allowed_local_media_path = allowed_local_media_path;
  if (engine.image_token_id() >= 0) server_options.image_processor = image_processor_of(model_path);
  Server server(engine, chat_template, server_options);
  int bound = server.bind(host, port);
  live_engine.store(&engine);
  live_server.store(&server);
  // The line scripts and tests wait for.
  std::printf("ellm: serving '%s' on http://%s:%d (sequence length %lld, %lld slots)\n", served_name.c_str(),
              host.c_str(), bound, static_cast<long long>(sequence_length), static_cast<long long>(batch_size));
  std::fflush(stdout);
  server.run();
  if (!stopping.load()) throw Error("serve: the HTTP listener stopped unexpectedly");
  while (!stopped.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // shutdown() returned
  log_info("serve: stopped");
  return 0;
}

}  // namespace ellm
