#include "server/connections.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <malloc.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>

#include "server/api_error.h"
#include "server/generation.h"
#include "server/log.h"

namespace fp8kv::server {
namespace {

using Clock = std::chrono::steady_clock;
thread_local int t_current_fd = -1;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

const char* reason(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

std::string error_response(int status, const std::string& message) {
  const std::string body = dump_json(ApiError(status, message).body());
  return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n{}",
                     status, reason(status), body.size(), status == 503 ? "Retry-After: 1\r\n" : "", body);
}

// "ip", port of a socket address (IPv4 or IPv6).
void endpoint(const sockaddr_storage& ss, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

// One inline "task queue": httplib's accept loop calls enqueue() with a task
// that runs FramedServer::process_and_close_socket, which only hands the
// socket to the reactor, so it runs on the accept thread.
struct InlineQueue : httplib::TaskQueue {
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

}  // namespace

int current_connection_socket() { return t_current_fd; }

Framing frame_request(std::string_view buf, size_t max_header_bytes, size_t max_body_bytes) {
  Framing f;
  auto fail = [&](int status, std::string message) {
    f.kind = Framing::error;
    f.status = status;
    f.message = std::move(message);
    return f;
  };
  // The head: the request line, header lines, an empty line (CRLF or LF).
  size_t pos = 0;
  bool first = true;
  std::vector<std::string_view> lengths;
  std::string te;
  for (;;) {
    const size_t nl = buf.find('\n', pos);
    if (nl == std::string_view::npos || nl + 1 > max_header_bytes) {
      if (buf.size() > max_header_bytes || nl != std::string_view::npos)
        return fail(431, fmt::format("the request line and headers exceed {} bytes", max_header_bytes));
      return f;  // incomplete
    }
    const std::string_view line = trim(buf.substr(pos, nl - pos));
    const size_t line_start = pos;
    pos = nl + 1;
    if (first) {
      first = false;
      continue;
    }
    if (line.empty()) break;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;  // httplib answers a malformed header line
    const std::string name = lower(trim(line.substr(0, colon)));
    const std::string_view value = trim(line.substr(colon + 1));
    if (name == "content-length") {
      // A list ("5, 5") is several values (RFC 9110 8.6).
      size_t s = 0;
      for (;;) {
        const size_t comma = value.find(',', s);
        lengths.push_back(trim(value.substr(s, comma == std::string_view::npos ? std::string_view::npos : comma - s)));
        if (comma == std::string_view::npos) break;
        s = comma + 1;
      }
    } else if (name == "transfer-encoding") {
      te += (te.empty() ? "" : ",") + lower(value);
    } else if (name == "expect" && lower(value) == "100-continue") {
      f.expect_continue = true;
      f.expect_begin = line_start;
      f.expect_end = pos;
    }
  }
  f.head_end = pos;
  // Content-Length: digits only; every value the same (else the framing is
  // ambiguous: a proxy in front may have used another one).
  std::optional<uint64_t> length;
  for (std::string_view v : lengths) {
    if (v.empty() || v.size() > 19 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return fail(400, fmt::format("invalid Content-Length '{}' (digits only)", std::string(v)));
    const uint64_t n = std::stoull(std::string(v));
    if (length && *length != n)
      return fail(400, fmt::format("conflicting Content-Length headers ({} and {})", *length, n));
    length = n;
  }
  if (!te.empty()) {
    if (length) return fail(400, "both Transfer-Encoding and Content-Length (ambiguous framing)");
    if (te != "chunked") return fail(501, fmt::format("Transfer-Encoding '{}' is not supported (only chunked)", te));
    // Find the end of the chunked body (httplib decodes it).
    size_t p = f.head_end;
    uint64_t body = 0;
    for (;;) {
      const size_t nl = buf.find('\n', p);
      if (nl == std::string_view::npos) {
        if (buf.size() - p > 1024) return fail(400, "malformed chunked body (chunk size line too long)");
        return f;
      }
      std::string_view sz = trim(buf.substr(p, nl - p));
      sz = sz.substr(0, sz.find(';'));
      sz = trim(sz);
      if (sz.empty() || sz.size() > 15 ||
          !std::all_of(sz.begin(), sz.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }))
        return fail(400, "malformed chunked body (bad chunk size)");
      const uint64_t n = std::stoull(std::string(sz), nullptr, 16);
      body += n;
      if (body > max_body_bytes)
        return fail(413, fmt::format("the request body is larger than {} bytes", max_body_bytes));
      p = nl + 1;
      if (n == 0) {  // trailers, then an empty line
        for (;;) {
          const size_t e = buf.find('\n', p);
          if (e == std::string_view::npos) {
            if (buf.size() - p > max_header_bytes) return fail(431, "the chunked trailers are too large");
            return f;
          }
          const bool empty = trim(buf.substr(p, e - p)).empty();
          p = e + 1;
          if (empty) break;
        }
        f.kind = Framing::complete;
        f.total = p;
        return f;
      }
      if (buf.size() < p + n + 1) return f;
      const size_t after = p + n;
      const size_t crlf = buf.compare(after, 2, "\r\n") == 0 ? 2 : (buf[after] == '\n' ? 1 : 0);
      if (crlf == 0) {
        if (buf[after] == '\r' && buf.size() == after + 1) return f;
        return fail(400, "malformed chunked body (no line end after a chunk)");
      }
      p = after + crlf;
    }
  }
  const uint64_t n = length.value_or(0);
  if (n > max_body_bytes)
    return fail(413, fmt::format("the request body is {} bytes, over the limit of {} bytes", n, max_body_bytes));
  f.total = f.head_end + n;
  if (buf.size() >= f.total) f.kind = Framing::complete;
  return f;
}

struct FramedServer::Conn {
  int fd = -1;
  std::string buf;
  std::string local_ip, remote_ip;
  int local_port = -1, remote_port = -1;
  Clock::time_point idle_since, head_start, body_start, closing_until;
  bool head_started = false, body_phase = false, continue_sent = false;
  bool dispatched = false, peer_eof = false, in_epoll = false, closing = false;
  std::mutex m;  // guards fd against a close racing a shutdown() at stop
  bool closed = false;
};

struct FramedServer::Job {
  std::shared_ptr<Conn> conn;
  std::string request;
};

namespace {

// httplib's parser reads one buffered request; its response goes to the socket.
class ConnStream : public httplib::Stream {
 public:
  ConnStream(int fd, const std::string& request, const std::string& lip, int lport, const std::string& rip, int rport,
             double write_timeout_s, const std::atomic<bool>& hard_stop)
      : fd_(fd), data_(request), lip_(lip), rip_(rip), lport_(lport), rport_(rport),
        write_timeout_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(write_timeout_s))), hard_stop_(hard_stop) {}
  bool is_readable() const override { return pos_ < data_.size(); }
  bool is_writable() const override { return !hard_stop_.load(); }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, data_.size() - pos_);
    std::memcpy(ptr, data_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    auto progress = Clock::now();
    while (done < size) {
      if (hard_stop_.load()) return -1;
      const ssize_t n = ::send(fd_, ptr + done, size - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
        progress = Clock::now();
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (Clock::now() - progress > write_timeout_) return -1;
        pollfd p{fd_, POLLOUT, 0};
        ::poll(&p, 1, 100);
        continue;
      }
      return -1;
    }
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = rip_;
    port = rport_;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = lip_;
    port = lport_;
  }
  socket_t socket() const override { return fd_; }

 private:
  int fd_;
  const std::string& data_;
  size_t pos_ = 0;
  const std::string &lip_, &rip_;
  int lport_, rport_;
  Clock::duration write_timeout_;
  const std::atomic<bool>& hard_stop_;
};

}  // namespace

FramedServer::FramedServer(ConnectionLimits limits) : limits_(limits) {
  // Every connection is a file descriptor: take the hard limit, and keep the
  // cap below it (the engine and the listener need some).
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      static_cast<rlim_t>(limits_.max_connections) + 256 > rl.rlim_cur) {
    const int cap = std::max(16, static_cast<int>(rl.rlim_cur) - 256);
    log().warn("--max-connections {}: the open-file limit is {}; capping connections at {}", limits_.max_connections,
               static_cast<long long>(rl.rlim_cur), cap);
    limits_.max_connections = cap;
  }
  // A large request's buffers (the body, its copies, the parsed JSON) go
  // back to the system when freed: glibc's default threshold rises after
  // each freed mmap, after which such blocks stay in the heap (a 4 MiB
  // prompt left 16 MB behind, linearly, until issue 37).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  // Workers come and go; each new thread would otherwise take a fresh
  // malloc arena and keep its pages after it exits.
  mallopt(M_ARENA_MAX, 4);
  set_payload_max_length(limits_.max_body_bytes);
  new_task_queue = [] { return new InlineQueue; };
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_ < 0 || wake_fd_ < 0) throw std::runtime_error("epoll/eventfd failed");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_fd_, &ev);
  reactor_ = std::thread([this] { reactor(); });
}

FramedServer::~FramedServer() {
  if (reactor_.joinable()) close_all(Clock::now());
  ::close(epoll_);
  ::close(wake_fd_);
}

void FramedServer::wake() {
  const uint64_t one = 1;
  const ssize_t r = ::write(wake_fd_, &one, sizeof one);
  (void)r;
}

bool FramedServer::process_and_close_socket(socket_t sock) {
  {
    std::lock_guard l(inbox_m_);
    accepted_.push_back(sock);
  }
  wake();
  return true;
}

void FramedServer::close_conn(const std::shared_ptr<Conn>& c) {
  {
    std::lock_guard l(c->m);
    if (c->closed) return;
    if (c->in_epoll) epoll_ctl(epoll_, EPOLL_CTL_DEL, c->fd, nullptr);
    ::close(c->fd);
    c->closed = true;
  }
  if (c->fd >= 0 && static_cast<size_t>(c->fd) < conns_.size() && conns_[c->fd] == c) conns_[c->fd].reset();
  --live_;
  --open_;
}

void FramedServer::answer_and_close(const std::shared_ptr<Conn>& c, int status, const std::string& message) {
  const std::string r = error_response(status, message);
  const ssize_t n = ::send(c->fd, r.data(), r.size(), MSG_NOSIGNAL);
  (void)n;
  // A lingering close: the client may still be sending; closing a socket with
  // unread data resets it, and the reset can discard the answer at the client.
  ::shutdown(c->fd, SHUT_WR);
  c->closing = true;
  c->closing_until = Clock::now() + std::chrono::seconds(1);
  c->buf.clear();
}

void FramedServer::on_readable(const std::shared_ptr<Conn>& c) {
  char tmp[65536];
  const size_t bound = limits_.max_header_bytes + limits_.max_body_bytes + sizeof tmp;
  for (;;) {
    const ssize_t n = ::recv(c->fd, tmp, sizeof tmp, 0);
    if (n > 0) {
      if (!c->closing) c->buf.append(tmp, static_cast<size_t>(n));
      if (c->buf.size() > bound) break;
      continue;
    }
    if (n == 0) {
      c->peer_eof = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    close_conn(c);
    return;
  }
  if (c->closing) {
    if (c->peer_eof) close_conn(c);
    return;
  }
  advance(c);
}

void FramedServer::advance(const std::shared_ptr<Conn>& c) {
  // Empty lines before a request line are skipped (RFC 9112 2.2).
  size_t skip = 0;
  while (skip < c->buf.size() && (c->buf[skip] == '\r' || c->buf[skip] == '\n')) ++skip;
  if (skip) c->buf.erase(0, skip);
  const auto now = Clock::now();
  if (c->buf.empty()) {
    c->head_started = c->body_phase = c->continue_sent = false;
    if (c->peer_eof) return close_conn(c);
  } else {
    if (!c->head_started) {
      c->head_started = true;
      c->head_start = now;
    }
    const Framing f = frame_request(c->buf, limits_.max_header_bytes, limits_.max_body_bytes);
    if (f.kind == Framing::error) return answer_and_close(c, f.status, f.message);
    if (f.kind == Framing::complete) {
      std::string request;
      if (f.expect_continue) {  // answered here (or the body is already in): httplib must not answer it again
        request = c->buf.substr(0, f.expect_begin) + c->buf.substr(f.expect_end, f.total - f.expect_end);
      } else {
        request = c->buf.substr(0, f.total);
      }
      c->buf.erase(0, f.total);
      c->head_started = c->body_phase = c->continue_sent = false;
      if (c->in_epoll) {
        epoll_ctl(epoll_, EPOLL_CTL_DEL, c->fd, nullptr);
        c->in_epoll = false;
      }
      c->dispatched = true;
      dispatch(c, std::move(request));
      return;
    }
    if (f.head_end > 0 && !c->body_phase) {
      c->body_phase = true;
      c->body_start = now;
    }
    if (f.head_end > 0 && f.expect_continue && !c->continue_sent) {
      static constexpr char k100[] = "HTTP/1.1 100 Continue\r\n\r\n";
      const ssize_t n = ::send(c->fd, k100, sizeof k100 - 1, MSG_NOSIGNAL);
      (void)n;
      c->continue_sent = true;
    }
    if (c->peer_eof) return close_conn(c);  // the rest of the request can no longer come
  }
  if (!c->in_epoll) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = c->fd;
    if (epoll_ctl(epoll_, EPOLL_CTL_ADD, c->fd, &ev) == 0) c->in_epoll = true;
  }
}

void FramedServer::check_deadlines() {
  const auto now = Clock::now();
  const auto secs = [](double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
  for (size_t fd = 0; fd < conns_.size(); ++fd) {
    const std::shared_ptr<Conn> c = conns_[fd];
    if (!c || c->dispatched) continue;
    if (c->closing) {
      if (now >= c->closing_until) close_conn(c);
    } else if (c->body_phase) {
      if (now - c->body_start > secs(limits_.body_timeout_s))
        answer_and_close(c, 408, fmt::format("the request body did not arrive within {} s", limits_.body_timeout_s));
    } else if (c->head_started) {
      if (now - c->head_start > secs(limits_.header_timeout_s))
        answer_and_close(c, 408,
                         fmt::format("the request line and headers did not arrive within {} s", limits_.header_timeout_s));
    } else if (now - c->idle_since > secs(limits_.idle_timeout_s)) {
      close_conn(c);
    }
  }
}

void FramedServer::reactor() {
  std::vector<epoll_event> evs(512);
  auto next_scan = Clock::now();
  while (!quit_.load()) {
    const int n = epoll_wait(epoll_, evs.data(), static_cast<int>(evs.size()), 100);
    for (int i = 0; i < n; ++i) {
      const int fd = evs[i].data.fd;
      if (fd == wake_fd_) {
        uint64_t v;
        const ssize_t r = ::read(wake_fd_, &v, sizeof v);
        (void)r;
        continue;
      }
      if (fd < 0 || static_cast<size_t>(fd) >= conns_.size()) continue;
      const std::shared_ptr<Conn> c = conns_[fd];
      if (c && !c->dispatched) on_readable(c);
    }
    std::vector<int> accepted;
    std::vector<std::pair<std::shared_ptr<Conn>, bool>> returned;
    {
      std::lock_guard l(inbox_m_);
      accepted.swap(accepted_);
      returned.swap(returned_);
    }
    const auto now = Clock::now();
    for (int fd : accepted) {
      if (stopping_.load() || live_ >= limits_.max_connections) {
        const std::string r = error_response(
            503, stopping_.load() ? "the server is shutting down"
                                  : fmt::format("too many open connections ({}; --max-connections)", live_));
        const ssize_t w = ::send(fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
        ::close(fd);
        continue;
      }
      auto c = std::make_shared<Conn>();
      c->fd = fd;
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // SSE chunks go out at once
      sockaddr_storage a{};
      socklen_t al = sizeof a;
      if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &al) == 0) endpoint(a, c->remote_ip, c->remote_port);
      al = sizeof a;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &al) == 0) endpoint(a, c->local_ip, c->local_port);
      c->idle_since = now;
      if (conns_.size() <= static_cast<size_t>(fd)) conns_.resize(static_cast<size_t>(fd) + 1);
      conns_[fd] = c;
      ++live_;
      ++open_;
      advance(c);
    }
    for (auto& [c, keep] : returned) {
      c->dispatched = false;
      if (!keep || stopping_.load()) {
        close_conn(c);
      } else {
        c->idle_since = now;
        advance(c);  // a pipelined request already buffered is taken now, in order
      }
    }
    if (now >= next_scan) {
      check_deadlines();
      next_scan = now + std::chrono::milliseconds(100);
    }
  }
}

void FramedServer::dispatch(std::shared_ptr<Conn> c, std::string request) {
  std::lock_guard l(jobs_m_);
  jobs_.push_back(Job{std::move(c), std::move(request)});
  if (static_cast<int>(jobs_.size()) > idle_workers_ && workers_ < limits_.max_workers) {
    ++workers_;
    std::thread([this] { worker(); }).detach();
  }
  jobs_cv_.notify_one();
}

void FramedServer::worker() {
  std::unique_lock l(jobs_m_);
  for (;;) {
    ++idle_workers_;
    // An idle worker exits (its thread_local scratch goes with it).
    jobs_cv_.wait_for(l, std::chrono::seconds(5), [&] { return !jobs_.empty() || quit_.load(); });
    --idle_workers_;
    if (jobs_.empty()) {
      --workers_;
      workers_done_.notify_all();
      return;
    }
    Job j = std::move(jobs_.front());
    jobs_.pop_front();
    l.unlock();
    Conn& c = *j.conn;
    ConnStream strm(c.fd, j.request, c.local_ip, c.local_port, c.remote_ip, c.remote_port, limits_.write_timeout_s,
                    hard_stop_);
    bool closed = false;
    t_current_fd = c.fd;
    bool ok = false;
    try {
      ok = process_request(strm, stopping_.load(), closed, std::function<void(httplib::Request&)>());
    } catch (const std::exception& e) {
      log().error("connection {}:{}: {}", c.remote_ip, c.remote_port, e.what());
    }
    t_current_fd = -1;
    if (j.request.size() > (1u << 20)) malloc_trim(0);  // the heap's free pages of a large request
    const bool keep = ok && !closed && !stopping_.load();
    {
      std::lock_guard il(inbox_m_);
      if (!quit_.load()) {
        returned_.emplace_back(j.conn, keep);
      } else {
        std::lock_guard cl(c.m);
        if (!c.closed) {
          ::close(c.fd);
          c.closed = true;
        }
      }
    }
    wake();
    j = Job{};
    l.lock();
  }
}

bool FramedServer::close_all(Clock::time_point deadline) {
  stopping_ = true;
  {
    std::lock_guard l(inbox_m_);
    quit_ = true;  // from here workers close their own connections
  }
  wake();
  if (reactor_.joinable()) reactor_.join();
  // The reactor has stopped: this thread owns conns_ now.
  for (int fd : accepted_) ::close(fd);
  accepted_.clear();
  for (auto& [c, keep] : returned_) c->dispatched = false;
  returned_.clear();
  std::vector<std::shared_ptr<Conn>> busy;
  for (auto& c : conns_) {
    if (!c) continue;
    if (c->dispatched) busy.push_back(c);
    else close_conn(c);
  }
  std::unique_lock l(jobs_m_);
  jobs_cv_.notify_all();
  if (!workers_done_.wait_until(l, deadline, [&] { return workers_ == 0; })) {
    hard_stop_ = true;  // writes fail from now on; blocked sockets are shut down
    for (auto& c : busy) {
      std::lock_guard cl(c->m);
      if (!c->closed) ::shutdown(c->fd, SHUT_RDWR);
    }
    workers_done_.wait_for(l, std::chrono::seconds(1), [&] { return workers_ == 0; });
  }
  // Jobs nobody took: close their connections.
  for (auto& j : jobs_) {
    std::lock_guard cl(j.conn->m);
    if (!j.conn->closed) {
      ::close(j.conn->fd);
      j.conn->closed = true;
    }
  }
  jobs_.clear();
  return workers_ == 0;
}

}  // namespace fp8kv::server
