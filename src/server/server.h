#pragma once
// The OpenAI/vLLM-compatible HTTP server over one Engine. HTTP threads parse, render, tokenize
// and submit; they only ever wait on their own RequestStream, so a slow client never stalls the
// engine and one bad request never touches another.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "image/processor.h"
#include "server/http_server.h"
#include "server/output_parser.h"

namespace ellm {

class ChatTemplate;

struct ServerOptions {
  std::string model_name;                 // what /v1/models lists and requests must name
  std::string model_path;                 // shown as the model's root
  std::string api_key;                    // "" = no authentication
  std::string replica_id;                 // label replica= in /metrics, header X-Ellm-Replica ("" = neither)
  size_t max_body_bytes = 8u << 20;       // larger bodies get 413
  ToolCallFormat tool_call_format = ToolCallFormat::none;
  bool parse_reasoning = true;            // split <think>...</think> into reasoning_content
  ConnectionLimits connections;           // timeouts, deadline, per-client cap (http_server.h)
  // Images, for a model with a vision tower (Engine::image_token_id() >= 0): the processor's
  // settings (the folder's preprocessor_config.json), the most image tokens one request may hold
  // (0: only the context limits them), and a folder whose files image parts may name as
  // file:// URLs ("": data URIs only). URLs on the network are never fetched.
  std::optional<ImageProcessorConfig> image_processor;
  int64_t max_image_tokens = 0;
  std::string allowed_local_media_path;
};

class Server {
 public:
  Server(Engine& engine, const ChatTemplate& chat_template, ServerOptions options);
  ~Server();

  // Throws Error naming host:port and the system's reason when it cannot be bound now (another
  // server listens there, say): called before a long model load, so the mistake shows at once.
  static void check_address(const std::string& host, int port);
  // Binds host:port (port 0 = any free port) and returns the port. Throws Error on failure,
  // also when another server already listens there (no SO_REUSEPORT).
  int bind(const std::string& host, int port);
  // Serves until shutdown() completes; returns then.
  void run();
  // Graceful stop, callable from any thread: /health and new requests get 503 at once, the
  // listening socket closes a moment later (new connections are refused), in-flight requests get
  // `grace` to finish and are then cancelled (they end with finish_reason "abort"); run()
  // returns once every connection has ended.
  void shutdown(std::chrono::milliseconds grace);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ellm
