// Disconnect detection for non-streaming requests (docs/server.md
// "Cancellation and shutdown"): the connection layer tells a handler its
// socket (src/server/connections.h), which it polls here; and the listen
// backlog.
#pragma once
#include <string>

namespace fp8kv::server {

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
