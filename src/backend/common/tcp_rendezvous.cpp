// TCP rendezvous (tcp_rendezvous.h). Framing: every message is a 16-byte header
// {magic "FP8KVRDV", u32 sender rank, u32 payload bytes} then the payload.
#include "backend/common/tcp_rendezvous.h"

#include "backend/common/rank_failure.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace fp8kv::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[8] = {'F', 'P', '8', 'K', 'V', 'R', 'D', 'V'};
// Rendezvous strings are small; the CPU multi-process communicator
// (backend/cpu/cpu_comm.cpp) sends activations through all_gather, hence the larger cap.
constexpr uint32_t kMaxPayload = 1u << 30;

[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error("tcp rendezvous: " + msg); }

std::string errno_str(int e) { return std::string(std::strerror(e)); }

// A send or receive that failed because of the peer: its socket closed or
// reset (lost), or the deadline passed (stalled). what() is the message
// fail() would give; all_gather turns it into a RankFailure naming the peer.
struct PeerIo : std::runtime_error {
  PeerIo(RankFailure::Kind k, const std::string& ctx, std::string r)
      : std::runtime_error("tcp rendezvous: " + ctx + ": " + r), kind(k), reason(std::move(r)) {}
  RankFailure::Kind kind;
  std::string reason;
};

bool peer_gone(int e) { return e == ECONNRESET || e == EPIPE || e == ENOTCONN || e == ECONNABORTED; }

// Rounded up: a poll() with it never returns before the deadline (the
// watchdog's "nothing within the timeout" holds to the millisecond).
int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1LL << 30));
}

void set_nonblocking(int fd) {
  const int fl = fcntl(fd, F_GETFL, 0);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) fail("fcntl(O_NONBLOCK): " + errno_str(errno));
}

// Waits for `events` on fd until the deadline; false on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) fail("poll: " + errno_str(errno));
  }
}

void send_all(int fd, const void* buf, size_t n, Clock::time_point deadline, const std::string& ctx) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) { p += w; n -= static_cast<size_t>(w); continue; }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, deadline)) throw PeerIo(RankFailure::Kind::stalled, ctx, "timed out sending");
      continue;
    }
    if (peer_gone(errno)) throw PeerIo(RankFailure::Kind::lost, ctx, errno_str(errno));
    fail(ctx + ": send failed: " + errno_str(errno));
  }
}

void recv_all(int fd, void* buf, size_t n, Clock::time_point deadline, const std::string& ctx) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) { p += r; n -= static_cast<size_t>(r); continue; }
    if (r == 0) throw PeerIo(RankFailure::Kind::lost, ctx, "peer closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_fd(fd, POLLIN, deadline))
        throw PeerIo(RankFailure::Kind::stalled, ctx, "timed out waiting for data");
      continue;
    }
    if (peer_gone(errno)) throw PeerIo(RankFailure::Kind::lost, ctx, errno_str(errno));
    fail(ctx + ": recv failed: " + errno_str(errno));
  }
}

void send_msg(int fd, uint32_t rank, const std::string& payload, Clock::time_point deadline, const std::string& ctx) {
  if (payload.size() > kMaxPayload) fail(ctx + ": payload too large");
  char hdr[16];
  std::memcpy(hdr, kMagic, 8);
  const uint32_t r = htonl(rank), n = htonl(static_cast<uint32_t>(payload.size()));
  std::memcpy(hdr + 8, &r, 4);
  std::memcpy(hdr + 12, &n, 4);
  send_all(fd, hdr, sizeof(hdr), deadline, ctx);
  send_all(fd, payload.data(), payload.size(), deadline, ctx);
}

std::string recv_msg(int fd, uint32_t* rank, Clock::time_point deadline, const std::string& ctx) {
  char hdr[16];
  recv_all(fd, hdr, sizeof(hdr), deadline, ctx);
  if (std::memcmp(hdr, kMagic, 8) != 0) fail(ctx + ": bad handshake (not an fp8kv rendezvous peer)");
  uint32_t r = 0, n = 0;
  std::memcpy(&r, hdr + 8, 4);
  std::memcpy(&n, hdr + 12, 4);
  r = ntohl(r);
  n = ntohl(n);
  if (n > kMaxPayload) fail(ctx + ": payload length " + std::to_string(n) + " too large");
  std::string s(n, '\0');
  recv_all(fd, s.data(), n, deadline, ctx);
  if (rank) *rank = r;
  return s;
}

}  // namespace

TcpRendezvous::TcpRendezvous(int rank, int world, const std::string& master_addr, int master_port,
                             std::chrono::milliseconds timeout)
    : rank_(rank), world_(world), where_(master_addr + ":" + std::to_string(master_port)), timeout_(timeout) {
  if (world < 1) fail("world size " + std::to_string(world) + " must be >= 1");
  if (rank < 0 || rank >= world) fail("rank " + std::to_string(rank) + " out of range for world size " + std::to_string(world));
  if (master_port <= 0 || master_port > 65535) fail("master port " + std::to_string(master_port) + " out of range 1..65535");
  if (master_addr.empty()) fail("empty master address");
  const auto deadline = Clock::now() + timeout_;
  const std::string me = "rank " + std::to_string(rank) + " of " + std::to_string(world) + " (master " + where_ + ")";

  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (world == 1) return;

  if (rank == 0) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (listen_fd_ < 0) fail(me + ": socket: " + errno_str(errno));
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(master_port));
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) < 0) {
      const int e = errno;
      ::close(listen_fd_);
      listen_fd_ = -1;
      fail(me + ": cannot listen on port " + std::to_string(master_port) + ": bind: " + errno_str(e));
    }
    if (::listen(listen_fd_, world) < 0) fail(me + ": listen: " + errno_str(errno));
    set_nonblocking(listen_fd_);
    peer_fd_.assign(static_cast<size_t>(world), -1);
    int joined = 0;
    while (joined < world - 1) {
      if (!wait_fd(listen_fd_, POLLIN, deadline))
        fail(me + ": timed out after " + std::to_string(timeout_.count()) + " ms waiting for " +
             std::to_string(world - 1 - joined) + " of " + std::to_string(world - 1) + " peers to connect");
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) continue;
        fail(me + ": accept: " + errno_str(errno));
      }
      set_nonblocking(fd);
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      uint32_t r = 0;
      std::string hello;
      try {
        hello = recv_msg(fd, &r, deadline, me + ": handshake");
      } catch (...) {
        ::close(fd);
        throw;
      }
      if (hello != std::to_string(world)) {
        ::close(fd);
        fail(me + ": a peer announced world size " + hello + ", expected " + std::to_string(world));
      }
      if (r == 0 || r >= static_cast<uint32_t>(world) || peer_fd_[r] >= 0) {
        ::close(fd);
        fail(me + ": a peer announced rank " + std::to_string(r) + " (out of range or duplicate)");
      }
      peer_fd_[r] = fd;
      ++joined;
    }
    return;
  }

  // rank > 0: resolve, then connect with retries until the deadline.
  // getaddrinfo has no timeout of its own (an unreachable DNS server can
  // stall it): it runs on a detached thread and we wait at most until the
  // deadline. Only the resolved sockaddr is copied out.
  struct Lookup {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    int rc = 0;
    sockaddr_storage addr{};
    socklen_t len = 0;
  };
  auto lk = std::make_shared<Lookup>();
  std::thread([lk, host = master_addr, port = std::to_string(master_port), hints] {
    addrinfo* r = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &r);
    std::lock_guard<std::mutex> g(lk->m);
    lk->rc = rc;
    if (rc == 0 && r && r->ai_addrlen <= sizeof(lk->addr)) {
      std::memcpy(&lk->addr, r->ai_addr, r->ai_addrlen);
      lk->len = r->ai_addrlen;
    } else if (rc == 0) {
      lk->rc = EAI_NONAME;
    }
    if (r) ::freeaddrinfo(r);
    lk->done = true;
    lk->cv.notify_all();
  }).detach();
  sockaddr_storage peer{};
  socklen_t peer_len = 0;
  {
    std::unique_lock<std::mutex> g(lk->m);
    if (!lk->cv.wait_until(g, deadline, [&] { return lk->done; }))
      fail(me + ": resolving master address '" + master_addr + "' timed out after " + std::to_string(timeout_.count()) + " ms");
    if (lk->rc != 0) fail(me + ": cannot resolve master address '" + master_addr + "': " + gai_strerror(lk->rc));
    peer = lk->addr;
    peer_len = lk->len;
  }
  std::string last = "no attempt";
  int fd = -1;
  for (;;) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) fail(me + ": socket: " + errno_str(errno));
    set_nonblocking(fd);
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&peer), peer_len);
    if (rc < 0 && errno == EINPROGRESS) {
      if (wait_fd(fd, POLLOUT, deadline)) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) break;
    last = errno_str(errno);
    ::close(fd);
    fd = -1;
    if (remaining_ms(deadline) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, remaining_ms(deadline))));
  }
  if (fd < 0)
    fail(me + ": could not connect to the master within " + std::to_string(timeout_.count()) + " ms (last error: " + last +
         "); is rank 0 running and listening there?");
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  peer_fd_.assign(1, fd);
  send_msg(fd, static_cast<uint32_t>(rank), std::to_string(world), deadline, me + ": handshake");
}

TcpRendezvous::~TcpRendezvous() {
  for (int fd : peer_fd_)
    if (fd >= 0) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::vector<std::string> TcpRendezvous::all_gather(const std::string& mine, const char* what) {
  return all_gather(mine, what, timeout_);
}

std::vector<std::string> TcpRendezvous::all_gather(const std::string& mine, const char* what,
                                                   std::chrono::milliseconds timeout) {
  std::vector<std::string> all(static_cast<size_t>(world_));
  all[static_cast<size_t>(rank_)] = mine;
  if (world_ == 1) return all;
  const auto deadline = Clock::now() + timeout;
  const std::string me = "rank " + std::to_string(rank_) + " of " + std::to_string(world_) + " (master " + where_ +
                         "), step '" + what + "'";
  // A peer that is gone or silent: the watchdog's one-line error
  // (backend/common/rank_failure.h), naming that peer and this step.
  auto guarded = [&](int peer, auto&& io) {
    try {
      return io();
    } catch (const PeerIo& e) {
      std::string reason = e.reason;
      if (e.kind == RankFailure::Kind::stalled) {
        char secs[32];
        std::snprintf(secs, sizeof(secs), "%g", static_cast<double>(timeout.count()) / 1000.0);
        reason = std::string(e.reason == "timed out sending" ? "could not send" : "nothing received") +
                 " within the collective timeout (" + secs + " s, --collective-timeout)";
      }
      throw RankFailure(e.kind, peer, rank_, what, reason);
    }
  };
  if (rank_ == 0) {
    for (int r = 1; r < world_; ++r) {
      uint32_t from = 0;
      all[static_cast<size_t>(r)] = guarded(r, [&] {
        return recv_msg(peer_fd_[static_cast<size_t>(r)], &from, deadline, me + ", from rank " + std::to_string(r));
      });
      if (from != static_cast<uint32_t>(r)) fail(me + ": message from rank " + std::to_string(r) + " says rank " + std::to_string(from));
    }
    // Broadcast: count-prefixed concatenation.
    std::string packed;
    for (const auto& s : all) {
      const uint32_t n = htonl(static_cast<uint32_t>(s.size()));
      packed.append(reinterpret_cast<const char*>(&n), 4);
      packed += s;
    }
    for (int r = 1; r < world_; ++r)
      guarded(r, [&] {
        send_msg(peer_fd_[static_cast<size_t>(r)], 0, packed, deadline, me + ", to rank " + std::to_string(r));
      });
    return all;
  }
  guarded(0, [&] { send_msg(peer_fd_[0], static_cast<uint32_t>(rank_), mine, deadline, me); });
  const std::string packed = guarded(0, [&] { return recv_msg(peer_fd_[0], nullptr, deadline, me); });
  size_t off = 0;
  for (int r = 0; r < world_; ++r) {
    uint32_t n = 0;
    if (off + 4 > packed.size()) fail(me + ": truncated reply");
    std::memcpy(&n, packed.data() + off, 4);
    n = ntohl(n);
    off += 4;
    if (off + n > packed.size()) fail(me + ": truncated reply");
    all[static_cast<size_t>(r)] = packed.substr(off, n);
    off += n;
  }
  return all;
}

}  // namespace fp8kv::comm
