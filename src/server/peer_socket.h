// Disconnect detection for non-streaming requests (docs/server.md
// "Cancellation and shutdown"). cpp-httplib 0.11 (Debian 12) gives a handler
// no access to its connection (Request::is_connection_closed came in a later
// version), so the handler finds the connection's socket itself: the one
// open TCP socket of this process whose local and peer addresses are the
// request's (Request::local_addr/local_port/remote_addr/remote_port). The
// socket stays open, and so names the same connection, until the handler
// returns. Linux only (/proc/self/fd); elsewhere nothing is found and the
// request runs to its end.
#pragma once
#include <string>

namespace fp8kv::server {

// The fd of the connection with these endpoints, or -1 when none is found.
int find_connection_socket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                           int remote_port);
// True when the peer has closed or reset the connection (poll: hang-up,
// error, or end of stream). A client that sends more bytes is still there.
bool connection_closed(int fd);

// cpp-httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG,
// fixed when Debian built the library), so a burst of connections (a
// benchmark sending 256 requests at once) overflows the accept queue and
// the dropped clients retry after a second. This finds this process's
// listening TCP socket on `port` and calls listen() again with `backlog`
// (Linux applies the new value). Returns false when none is found.
bool raise_listen_backlog(int port, int backlog);

}  // namespace fp8kv::server
