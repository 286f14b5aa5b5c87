#include "server/peer_socket.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace fp8kv::server {

bool connection_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) return true;
  if (p.revents & POLLIN) {
    char c;
    const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0;  // end of stream; > 0: the client sent more (still there)
  }
  return false;
}

bool raise_listen_backlog(int port, int backlog) {
  std::error_code ec;
  bool done = false;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::atoi(e.path().filename().c_str());
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage a{};
    socklen_t alen = sizeof a;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &alen) != 0) continue;
    int p = -1;
    if (a.ss_family == AF_INET) p = ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
    if (a.ss_family == AF_INET6) p = ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
    if (p == port && ::listen(fd, backlog) == 0) done = true;
  }
  return done;
}

}  // namespace fp8kv::server

