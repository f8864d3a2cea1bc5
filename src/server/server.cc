#include "server/server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "server/anthropic_response.h"
#include "server/api_response.h"
#include "server/server_impl.h"
#include "text/chat_template.h"

namespace ellm {

using nlohmann::json;
using ojson = nlohmann::ordered_json;  // requests keep their key order: templates render it

std::string json_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string sse_data(const json& j) { return "data: " + json_text(j) + "\n\n"; }

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(json_text(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e, const std::string& path) {
  const bool anthropic = path.starts_with("/v1/messages");
  send_json(res, e.status, anthropic ? anthropic_error_json(e) : error_json(e));
}

namespace {

// How long a draining server keeps accepting connections (to answer them 503).
constexpr std::chrono::milliseconds kListenerLinger{500};

const char* route_label(const std::string& path) {
  static const char* known[] = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/health",
                                "/metrics", "/tokenize", "/detokenize", "/v1/messages",
                                "/v1/messages/count_tokens"};
  for (const char* k : known)
    if (path == k) return k;
  return "other";
}

bool needs_auth(const std::string& path) { return path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize"; }

}  // namespace

Server::Impl::Impl(Engine& engine, const ChatTemplate& chat_template, ServerOptions opts)
    : engine(engine), chat_template(chat_template), options(std::move(opts)),
      sequence_length(engine.sequence_length()), http(options.connections) {
  http.set_payload_max_length(options.max_body_bytes);
  http.set_tcp_nodelay(true);

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // Which replica answered, on every response (set before routing, so errors carry it too).
    if (!options.replica_id.empty()) res.set_header("X-Ellm-Replica", options.replica_id);
    // A Bearer token (OpenAI clients) or x-api-key (Anthropic clients).
    if (!options.api_key.empty() && needs_auth(req.path) &&
        req.get_header_value("Authorization") != "Bearer " + options.api_key &&
        req.get_header_value("x-api-key") != options.api_key) {
      send_error(res, ApiError(401, "authentication_error", "invalid or missing API key (send 'Authorization: Bearer <key>' or 'x-api-key: <key>')"), req.path);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (draining.load() && req.path != "/health" && req.path != "/metrics") {
      send_error(res, ApiError(503, "service_unavailable", "the server is shutting down"), req.path);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Statuses httplib produces itself (404 route, 413 body, 400 bad HTTP) get the JSON error body.
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.is_chunked_content_provider_) return httplib::Server::HandlerResponse::Unhandled;
    std::string message = res.status == 404   ? "no route " + req.method + " " + req.path
                          : res.status == 413 ? "request body is larger than the server's limit (--max-body-size)"
                          : res.status == 405 ? "method not allowed"
                                              : "bad request";
    send_error(res, ApiError(res.status, res.status == 404 ? "not_found_error" : "invalid_request_error", message), req.path);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string message = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      message = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, "internal_server_error", message), req.path);
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    counters.count(route_label(req.path), res.status);
  });

  // Handlers turn ApiError/Error into 4xx; anything else reaches the exception handler as 500.
  auto guarded = [this](void (Impl::*route)(const httplib::Request&, httplib::Response&)) {
    return [this, route](const httplib::Request& req, httplib::Response& res) {
      try {
        (this->*route)(req, res);
      } catch (const ApiError& e) {
        send_error(res, e, req.path);
      } catch (const Error& e) {
        send_error(res, ApiError(400, "invalid_request_error", e.what()), req.path);
      }
    };
  };
  http.Post("/v1/chat/completions", guarded(&Impl::chat_completions));
  http.Post("/v1/completions", guarded(&Impl::completions));
  http.Post("/v1/responses", guarded(&Impl::responses));
  http.Get("/v1/models", guarded(&Impl::models));
  http.Post("/tokenize", guarded(&Impl::tokenize));
  http.Post("/detokenize", guarded(&Impl::detokenize));
  http.Post("/v1/messages", guarded(&Impl::messages));
  http.Post("/v1/messages/count_tokens", guarded(&Impl::count_tokens));
  // Admin: the cached sessions of every tier, and dropping them (behind the API key, as /v1).
  http.Get("/v1/sessions", [this](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    for (const SessionInfo& s : this->engine.list_sessions())
      data.push_back({{"id", s.id}, {"tier", tier_name(s.tier)}, {"tokens", s.tokens}, {"bytes", s.bytes},
                      {"snapshots", s.snapshots},
                      {"idle_seconds", s.idle_seconds < 0 ? json(nullptr) : json(s.idle_seconds)}});
    send_json(res, 200, {{"object", "list"}, {"data", data}});
  });
  http.Delete("/v1/sessions", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"dropped", this->engine.drop_sessions()}});
  });
  // A load balancer takes a draining server out of rotation on the first 503.
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining.load()) send_error(res, ApiError(503, "service_unavailable", "the server is shutting down"));
    else res.status = 200;
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus_text(this->engine.metrics(), counters, options.model_name, options.replica_id), "text/plain; version=0.0.4");
  });
}

void Server::Impl::check_model_name(const std::string& requested) const {
  if (!requested.empty() && requested != options.model_name)
    throw ApiError(404, "not_found_error", "the model '" + requested + "' does not exist; this server serves '" + options.model_name + "'", "model");
}

void Server::Impl::models(const httplib::Request&, httplib::Response& res) {
  json model = {{"id", options.model_name},
                {"object", "model"},
                {"created", unix_time()},
                {"owned_by", "ellm"},
                {"root", options.model_path},
                {"parent", nullptr},
                {"max_model_len", sequence_length}};
  send_json(res, 200, {{"object", "list"}, {"data", json::array({model})}, {"models", json::array({codex_model_info()})}});
}

// vLLM shapes: {"prompt": text} or {"messages": [...]} -> {"count", "max_model_len", "tokens", "token_strs"}.
void Server::Impl::tokenize(const httplib::Request& req, httplib::Response& res) {
  ojson body = parse_body(req.body);
  if (auto it = body.find("model"); it != body.end() && it->is_string()) check_model_name(it->get<std::string>());
  std::string text;
  std::vector<PreparedImage> images;
  if (auto it = body.find("messages"); it != body.end()) {
    if (!it->is_array() || it->empty()) throw_bad_request("'messages' must be a non-empty list", "messages");
    images = chat_images(*it);
    bool add_generation_prompt = body.value("add_generation_prompt", true);
    ojson tools = body.contains("tools") && body["tools"].is_array() ? body["tools"] : ojson(nullptr);
    ojson kwargs = body.contains("chat_template_kwargs") && body["chat_template_kwargs"].is_object() ? body["chat_template_kwargs"] : ojson::object();
    text = chat_template.render(*it, tools, add_generation_prompt, kwargs);
  } else if (auto p = body.find("prompt"); p != body.end() && p->is_string()) {
    text = p->get<std::string>();
  } else {
    throw_bad_request("'prompt' (a string) or 'messages' is required", "prompt");
  }
  GenerateRequest request;  // its prompt with each image's tokens in place
  request.prompt = engine.encode(text);
  place_images(std::move(images), request);
  const std::vector<int32_t>& ids = request.prompt;
  json strs = nullptr;
  if (body.value("return_token_strs", false)) {
    strs = json::array();
    for (int32_t id : ids) strs.push_back(engine.token_text(id));
  }
  send_json(res, 200, {{"count", ids.size()}, {"max_model_len", sequence_length}, {"tokens", ids}, {"token_strs", strs}});
}

void Server::Impl::detokenize(const httplib::Request& req, httplib::Response& res) {
  ojson body = parse_body(req.body);
  if (auto it = body.find("model"); it != body.end() && it->is_string()) check_model_name(it->get<std::string>());
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) throw_bad_request("'tokens' must be a list of token ids", "tokens");
  std::vector<int32_t> ids;
  for (const ojson& x : *it) {
    if (!x.is_number_integer() || x.get<int64_t>() > INT32_MAX || !engine.is_token(x.get<int32_t>()))
      throw_bad_request("'tokens' holds a value that is not a token id of this model", "tokens");
    ids.push_back(x.get<int32_t>());
  }
  send_json(res, 200, {{"prompt", engine.decode(ids, false)}});
}

bool Server::Impl::past_grace() const {
  if (!draining.load()) return false;
  return std::chrono::steady_clock::now().time_since_epoch().count() > grace_deadline_ns.load();
}

// ---- Server ----

namespace {

// Why binding host:port fails, as the system says it, or "" when it can be bound now (httplib
// only reports that it failed). Binds a socket of its own with the server's options.
std::string bind_error(const std::string& host, int port) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0)
    return ::gai_strerror(rc);
  std::string why = "no address to bind";
  for (addrinfo* a = found; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) { why = std::strerror(errno); continue; }
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    const bool bound = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!bound) why = std::strerror(errno);
    ::close(fd);
    if (bound) { why.clear(); break; }
  }
  ::freeaddrinfo(found);
  return why;
}

std::string cannot_listen(const std::string& host, int port, const std::string& why) {
  return "serve: cannot listen on " + host + ":" + std::to_string(port) + ": " + why;
}

}  // namespace

Server::Server(Engine& engine, const ChatTemplate& chat_template, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, chat_template, std::move(options))) {}

Server::~Server() = default;

void Server::check_address(const std::string& host, int port) {
  if (port == 0) return;
  if (std::string why = bind_error(host, port); !why.empty()) throw Error(cannot_listen(host, port, why));
}

int Server::bind(const std::string& host, int port) {
  if (port == 0) {
    int bound = impl_->http.bind_to_any_port(host);
    if (bound <= 0) throw Error("serve: cannot bind " + host + " to any port");
    impl_->http.widen_backlog();
    return bound;
  }
  if (!impl_->http.bind_to_port(host, port)) {
    std::string why = bind_error(host, port);
    throw Error(cannot_listen(host, port, why.empty() ? "bind failed" : why));
  }
  impl_->http.widen_backlog();
  return port;
}

void Server::run() { impl_->http.listen_after_bind(); }

void Server::shutdown(std::chrono::milliseconds grace) {
  using namespace std::chrono;
  Impl& s = *impl_;
  const auto start = steady_clock::now();
  s.grace_deadline_ns.store((start + grace).time_since_epoch().count());
  s.draining.store(true);  // from now on /health and new requests answer 503
  s.http.begin_drain();
  // Keep listening a moment, so a load balancer polling /health sees the 503 rather than a
  // refused connection it might take for a network fault; then refuse new connections.
  std::this_thread::sleep_for(std::min<milliseconds>(grace, kListenerLinger));
  s.http.close_listener();
  // In-flight requests finish or, past the grace period, cancel themselves (see respond()) and
  // end within an engine step; their connections close once the last bytes are written (idle
  // ones at once). A client that does not take its last bytes is cut off a little later.
  const auto give_up = start + grace + seconds(3);
  while ((s.in_flight.load() > 0 || s.http.connections() > 0) && steady_clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(20));
  s.http.drop_connections();
}

}  // namespace ellm
