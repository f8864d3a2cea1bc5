#pragma once
// httplib::Server with the connection handling a public server needs against slow and hostile
// clients. Debian 12's cpp-httplib (0.11.4) times out each read and write system call on its own
// and serves connections from a fixed pool, so a client that sends its request a byte every few
// seconds, or reads a stream a byte at a time, holds a pool thread for as long as it likes, and
// as many such clients as the pool has threads block every other request. Here:
//  - each connection is served by its own thread from a pool that grows on demand up to
//    `max_connections`: a connection that waits for a slow client costs a sleeping thread, not
//    the place of a normal request;
//  - a request's header and body must arrive within `request_deadline` of its first byte, and
//    no read may wait longer than `read_timeout`;
//  - one write (a whole response, or one chunk of a stream) must complete within
//    `write_timeout`, however slowly the client keeps taking bytes;
//  - one client address may hold at most `max_per_client` connections; more are answered 429
//    and closed at once.
// httplib's process_and_close_socket() is a virtual function taking the accepted socket, so
// overriding it is the accept-side hook: it runs the keep-alive loop over httplib's own request
// parser (the protected process_request()) with a Stream that enforces the limits above. It also
// lets the handlers of a request see their client's socket (client_gone()), which httplib 0.11.4
// does not offer (no Request::is_connection_closed).
#include <atomic>
#include <chrono>
#include <httplib.h>
#include <map>
#include <mutex>
#include <set>
#include <string>

namespace ellm {

struct ConnectionLimits {
  int max_connections = 512;  // connections served at once; more wait to be accepted
  int max_per_client = 64;    // connections from one address; 0 = no cap
  std::chrono::milliseconds read_timeout{10'000};
  std::chrono::milliseconds write_timeout{30'000};
  std::chrono::milliseconds request_deadline{60'000};
  std::chrono::milliseconds keep_alive_timeout{5'000};  // an idle connection is closed after this
  int keep_alive_max_requests = 100;
};

class HttpServer : public httplib::Server {
 public:
  explicit HttpServer(ConnectionLimits limits);

  // Call after binding: httplib listens with a backlog of 5 (a compile-time constant of the
  // Debian library), so a burst of connections overflowed the accept queue and the kernel made
  // the rest retry their handshakes a second or more later. Linux takes a new backlog from a
  // second listen() on the bound socket.
  void widen_backlog();
  // Draining: every response from now on closes its connection and idle connections close.
  void begin_drain();
  // Stops listening: new connections are refused (the socket is shut down, and httplib's accept
  // loop then closes it and returns from listen once every accepted connection has ended).
  // Requests still being received are dropped; requests being handled go on.
  void close_listener();
  // Shuts down the socket of every connection, which unblocks any read or write at once.
  void drop_connections();
  int connections() const;

  // True when the client of the request the calling thread serves has hung up. False outside
  // a request and while the client is there (even if it sent more data).
  static bool client_gone();

 private:
  bool process_and_close_socket(socket_t sock) override;
  bool admit(socket_t sock, std::string& address);
  void release(socket_t sock, const std::string& address);

  friend class ClientStream;
  ConnectionLimits limits_;
  std::atomic<bool> draining_{false}, listener_closed_{false};
  mutable std::mutex mutex_;
  std::map<std::string, int> per_address_;
  std::set<socket_t> sockets_;
};

}  // namespace ellm
