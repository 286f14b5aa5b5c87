// The server's connection layer (docs/server.md "Connections"): cpp-httplib
// parses and routes requests, but its own connection loop gives every
// connection a pool thread for its whole life (slow clients exhaust the pool
// and hold shutdown), applies its read timeout per recv (a client dripping a
// header line every few seconds never times out), uses the first of two
// Content-Length headers, and drops pipelined requests. This subclass
// overrides httplib's per-connection hook (Server::process_and_close_socket,
// a virtual) and keeps only its request parser and router:
//
//   accept (httplib's thread) -> reactor (one thread, epoll): reads each
//   request whole, with deadlines, checks its framing -> worker pool (grows
//   on demand, idle workers exit) runs httplib's process_request on the
//   buffered bytes and writes the response -> the connection goes back to
//   the reactor, which takes the next pipelined request in order.
//
// So a connection costs a thread only while a complete request is being
// answered, and connections are capped.
#pragma once
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace fp8kv::server {

struct ConnectionLimits {
  int max_connections = 4096;          // open connections; the next gets a 503 and is closed
  double idle_timeout_s = 5.0;         // keep-alive: no byte of the next request for this long closes the connection
  double header_timeout_s = 10.0;      // from a request's first byte to the end of its head (else 408)
  double body_timeout_s = 60.0;        // from the end of the head to the end of the body (else 408)
  double write_timeout_s = 10.0;       // a response write that makes no progress for this long fails
  size_t max_header_bytes = 64 << 10;  // request line + headers (else 431)
  size_t max_body_bytes = 32u << 20;   // (else 413, answered before the body is read)
  int max_workers = 256;               // threads answering complete requests at once
};

// Where the first request in `buf` ends (RFC 9112 framing), checked before
// httplib sees it: Content-Length digits only, several equal values allowed
// and differing ones refused (400), Transfer-Encoding chunked (other codings
// 501), both together refused (400), a body over max_body_bytes refused from
// its Content-Length (413), a head over max_header_bytes refused (431).
struct Framing {
  enum Kind { incomplete, complete, error } kind = incomplete;
  size_t head_end = 0;  // bytes of the request line + headers + empty line; 0: not all here yet
  size_t total = 0;     // complete: bytes of the whole request
  int status = 0;       // error: the HTTP status to answer, and why
  std::string message;
  bool expect_continue = false;  // "Expect: 100-continue", its line at [expect_begin, expect_end)
  size_t expect_begin = 0, expect_end = 0;
};
Framing frame_request(std::string_view buf, size_t max_header_bytes, size_t max_body_bytes);

// The socket of the connection whose request this thread is answering (a
// handler runs on it), or -1 outside a request.
int current_connection_socket();

class FramedServer : public httplib::Server {
 public:
  explicit FramedServer(ConnectionLimits limits);
  ~FramedServer() override;
  FramedServer(const FramedServer&) = delete;
  FramedServer& operator=(const FramedServer&) = delete;

  const ConnectionLimits& limits() const { return limits_; }
  // Connections open now (for tests and logs).
  int open_connections() const { return open_.load(); }

  // After Server::stop() (listen_after_bind() has returned): closes every
  // connection that is not being answered now, lets the ones being answered
  // finish until `deadline`, then shuts their sockets down. Returns false
  // when a worker is still inside a handler a second after that.
  bool close_all(std::chrono::steady_clock::time_point deadline);
  // Responses written after this are the last on their connections.
  void stop_keep_alive() { stopping_ = true; }

 private:
  struct Conn;
  struct Job;
  bool process_and_close_socket(socket_t sock) override;
  void reactor();
  void worker();
  void wake();
  void on_readable(const std::shared_ptr<Conn>& c);
  // Dispatches the next complete request buffered on `c`, answers a framing
  // error, or arms the deadline for what is still missing.
  void advance(const std::shared_ptr<Conn>& c);
  void answer_and_close(const std::shared_ptr<Conn>& c, int status, const std::string& message);
  void close_conn(const std::shared_ptr<Conn>& c);
  void check_deadlines();
  void dispatch(std::shared_ptr<Conn> c, std::string request);

  ConnectionLimits limits_;
  int epoll_ = -1, wake_fd_ = -1;
  std::atomic<bool> stopping_{false}, quit_{false}, hard_stop_{false};
  std::atomic<int> open_{0};
  // Handed to the reactor thread (accepted sockets, answered connections).
  std::mutex inbox_m_;
  std::vector<int> accepted_;
  std::vector<std::pair<std::shared_ptr<Conn>, bool>> returned_;  // keep-alive?
  // Reactor thread only.
  std::vector<std::shared_ptr<Conn>> conns_;  // indexed by fd
  int live_ = 0;
  // Workers.
  std::mutex jobs_m_;
  std::condition_variable jobs_cv_;
  std::deque<Job> jobs_;
  int workers_ = 0, idle_workers_ = 0;
  std::condition_variable workers_done_;
  std::thread reactor_;
};

}  // namespace fp8kv::server
