#include "server/http_server.h"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <system_error>
#include <thread>
#include <unistd.h>
#include <vector>

namespace ellm {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The socket of the connection this thread serves (-1 when none), for client_gone().
thread_local int t_client_socket = -1;

// Waits are cut into slices this long so a drain or a closed listener is noticed promptly.
constexpr milliseconds kWaitSlice{100};

int wait_ms(Clock::duration d) {
  auto ms = std::chrono::ceil<milliseconds>(d).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, kWaitSlice.count()));
}

// poll() one socket for `events`, up to `ms`; > 0 ready, 0 timeout, < 0 error.
int poll_one(int fd, short events, int ms, short* revents = nullptr) {
  pollfd p{fd, events, 0};
  int r;
  do r = ::poll(&p, 1, ms);
  while (r < 0 && errno == EINTR);
  if (revents) *revents = p.revents;
  return r;
}

// The peer has closed its side or the connection broke. Data it sent and we have not read yet
// (a pipelined request) says it is still there.
bool peer_closed(int fd) {
  short revents = 0;
  if (poll_one(fd, POLLIN | POLLRDHUP, 0, &revents) <= 0) return false;
  if (revents & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) return true;
  char byte;
  ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void endpoint(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  int r = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
               : ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (r != 0 || ::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, serv, sizeof serv,
                              NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    ip.clear();
    port = -1;
    return;
  }
  ip = host;
  port = std::atoi(serv);
}

// One thread per connection, started when a connection finds no idle thread, up to a limit
// (beyond it accepted connections wait in order). A connection held by a slow client then costs
// one sleeping thread instead of a place in a small fixed pool. Threads stay for later
// connections once started.
class ConnectionThreads final : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(size_t max_threads) : max_threads_(std::max<size_t>(1, max_threads)) {}
  ~ConnectionThreads() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(fn));
    if (jobs_.size() > idle_ && threads_.size() < max_threads_) {
      try {
        threads_.emplace_back([this] { work(); });
      } catch (const std::system_error&) {
        // Out of threads for now: the connection waits for one of those already running.
      }
    }
    ready_.notify_one();
  }

  // Runs what was accepted, then ends every thread.
  void shutdown() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    ready_.notify_all();
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  void work() {
    std::unique_lock lock(mutex_);
    for (;;) {
      idle_++;
      ready_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      idle_--;
      if (jobs_.empty()) return;
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }

  const size_t max_threads_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stop_ = false;
};

}  // namespace

// The Stream httplib's parser reads requests from and writes responses to: a buffered socket
// whose waits end at the request deadline, the read timeout, and when the listener closes.
class ClientStream final : public httplib::Stream {
 public:
  ClientStream(const HttpServer& server, int fd) : server_(server), fd_(fd) { start_request(); }

  void start_request() { deadline_ = Clock::now() + server_.limits_.request_deadline; }
  bool buffered() const { return pos_ < len_; }
  // A read timed out, passed the deadline or failed: httplib may still answer (400), but the
  // connection must end, or the rest of a trickled body would be read as the next request.
  bool read_failed() const { return read_failed_; }
  // A write did not complete in time: the client is stalled or nearly so.
  bool write_timed_out() const { return write_timed_out_; }

  // Waits for the first byte of the next request on a kept-alive connection.
  bool wait_for_next_request() const {
    if (buffered()) return true;
    const auto until = Clock::now() + server_.limits_.keep_alive_timeout;
    while (!server_.draining_.load()) {
      const auto now = Clock::now();
      if (now >= until) return false;
      int r = poll_one(fd_, POLLIN, wait_ms(until - now));
      if (r != 0) return r > 0;
    }
    return false;
  }

  bool is_readable() const override { return buffered() || wait_readable(); }

  // httplib asks before each piece of a stream: room in the socket within the write timeout.
  bool is_writable() const override {
    int r = poll_one(fd_, POLLOUT, static_cast<int>(server_.limits_.write_timeout.count()));
    if (r == 0) write_timed_out_ = true;
    return r > 0 && !peer_closed(fd_);
  }

  ssize_t read(char* ptr, size_t size) override {
    if (!buffered()) {
      if (!wait_readable()) {
        read_failed_ = true;
        return -1;
      }
      ssize_t n;
      do n = ::recv(fd_, buffer_, sizeof buffer_, MSG_DONTWAIT);
      while (n < 0 && errno == EINTR);
      if (n <= 0) {
        read_failed_ = true;
        return n < 0 ? -1 : 0;
      }
      pos_ = 0;
      len_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, len_ - pos_);
    std::memcpy(ptr, buffer_ + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  // Writes all of it or fails: the whole write must complete within the write timeout, so a
  // client that takes a byte now and then cannot stretch it forever (httplib's own loop would
  // restart the timeout after every partial send).
  ssize_t write(const char* ptr, size_t size) override {
    const auto until = Clock::now() + server_.limits_.write_timeout;
    size_t sent = 0;
    while (sent < size) {
      const auto now = Clock::now();
      if (now >= until) {
        write_timed_out_ = true;
        return -1;
      }
      short revents = 0;
      int r = poll_one(fd_, POLLOUT, static_cast<int>(std::chrono::ceil<milliseconds>(until - now).count()), &revents);
      if (r < 0 || (r > 0 && (revents & (POLLERR | POLLHUP | POLLNVAL)))) return -1;
      if (r == 0) continue;
      ssize_t n = ::send(fd_, ptr + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        return -1;
      }
      sent += static_cast<size_t>(n);
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { endpoint(fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { endpoint(fd_, false, ip, port); }
  socket_t socket() const override { return fd_; }

 private:
  // Data to read within both the read timeout and the request's deadline.
  bool wait_readable() const {
    const auto now = Clock::now();
    const auto until = std::min(deadline_, now + server_.limits_.read_timeout);
    for (auto t = now; t < until; t = Clock::now()) {
      if (server_.listener_closed_.load()) return false;
      int r = poll_one(fd_, POLLIN, wait_ms(until - t));
      if (r != 0) return r > 0;
    }
    return false;
  }

  const HttpServer& server_;
  const int fd_;
  Clock::time_point deadline_;
  char buffer_[4096];
  size_t pos_ = 0, len_ = 0;
  bool read_failed_ = false;
  mutable bool write_timed_out_ = false;
};

HttpServer::HttpServer(ConnectionLimits limits) : limits_(limits) {
  // httplib's default sets SO_REUSEPORT, with which a second server binds a port another one
  // listens on and the kernel splits the connections between them. SO_REUSEADDR alone still
  // lets a restarted server bind while old connections sit in TIME_WAIT.
  set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const size_t threads = static_cast<size_t>(std::max(4, limits_.max_connections));
  new_task_queue = [threads] { return new ConnectionThreads(threads); };
  // What the Keep-Alive header announces; process_and_close_socket() enforces them.
  set_keep_alive_max_count(static_cast<size_t>(std::max(1, limits_.keep_alive_max_requests)));
  set_keep_alive_timeout(std::chrono::duration_cast<std::chrono::seconds>(limits_.keep_alive_timeout).count());
}

void HttpServer::widen_backlog() {
  socket_t listener = svr_sock_.load();
  if (listener != INVALID_SOCKET) ::listen(listener, SOMAXCONN);
}

void HttpServer::begin_drain() { draining_.store(true); }

void HttpServer::close_listener() {
  draining_.store(true);
  listener_closed_.store(true);
  // Not stop(): that marks the server socket invalid, which httplib's chunked writer takes as
  // "shutting down" and cuts every stream mid-way. Shutting the listening socket down makes
  // accept() fail, httplib's loop closes the socket, and the kernel refuses new connections.
  socket_t listener = svr_sock_.load();
  if (listener != INVALID_SOCKET) ::shutdown(listener, SHUT_RDWR);
}

void HttpServer::drop_connections() {
  std::lock_guard lock(mutex_);
  for (socket_t s : sockets_) ::shutdown(s, SHUT_RDWR);  // still open: closed only after release()
}

int HttpServer::connections() const {
  std::lock_guard lock(mutex_);
  return static_cast<int>(sockets_.size());
}

bool HttpServer::client_gone() { return t_client_socket >= 0 && peer_closed(t_client_socket); }

bool HttpServer::admit(socket_t sock, std::string& address) {
  int port = 0;
  endpoint(sock, true, address, port);
  std::lock_guard lock(mutex_);
  sockets_.insert(sock);
  int& count = per_address_[address];
  if (limits_.max_per_client > 0 && count >= limits_.max_per_client) {
    address.clear();  // not counted: release() leaves the count alone
    return false;
  }
  count++;
  return true;
}

void HttpServer::release(socket_t sock, const std::string& address) {
  std::lock_guard lock(mutex_);
  sockets_.erase(sock);
  if (address.empty()) return;
  auto it = per_address_.find(address);
  if (it != per_address_.end() && --it->second <= 0) per_address_.erase(it);
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  std::string address;
  bool ok = false;
  if (admit(sock, address)) {
    ClientStream stream(*this, sock);
    t_client_socket = sock;
    struct ResetIfStalled {  // runs before the socket is closed below
      const ClientStream& stream;
      ~ResetIfStalled() {
        // Close with a reset rather than a FIN queued behind megabytes the client is not taking:
        // the kernel drops them at once and the client learns at once that it was cut off.
        if (!stream.write_timed_out()) return;
        linger reset{1, 0};
        ::setsockopt(stream.socket(), SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
      }
    } reset_if_stalled{stream};
    for (int served = 0; served < limits_.keep_alive_max_requests && !listener_closed_.load(); served++) {
      if (served > 0) {
        if (!stream.wait_for_next_request()) break;
        stream.start_request();
      }
      const bool close = draining_.load() || served + 1 == limits_.keep_alive_max_requests;
      bool closed = false;
      ok = process_request(stream, close, closed, nullptr);
      if (!ok || closed || stream.read_failed() || draining_.load()) break;
    }
    t_client_socket = -1;
  } else {
    // Over the per-address cap: answer without reading the request, and close.
    static const std::string body =
        R"({"error":{"message":"too many connections from this address","type":"rate_limit_error","param":null,"code":429}})";
    const std::string reply = "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nConnection: close\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    [[maybe_unused]] ssize_t n = ::send(sock, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  release(sock, address);
  ::close(sock);  // sends what is left, then FIN; a reset for a stalled client (ResetIfStalled)
  return ok;
}

}  // namespace ellm
