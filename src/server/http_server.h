// `fp8kv serve`: the OpenAI-compatible HTTP server (cpp-httplib). Routes,
// API key, error bodies and SSE streaming live here; generation runs on the
// EngineLoop thread (docs/server.md "Threading").
#pragma once
#include <cstddef>
#include <exception>
#include <functional>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/request.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                  // 0: any free port
  std::string api_key;              // empty: no key required
  std::string served_model_name;    // empty: the model path as given
  int max_waiting = 1024;           // queued requests beyond the running batch; more get 503
  size_t max_body_bytes = 32u << 20;
  double shutdown_grace_s = 30.0;   // bounds shutdown: the process exits within it + kShutdownFlushSeconds
  int max_connections = 4096;       // open HTTP connections (docs/server.md "Connections")
  int max_num_seqs = 8;             // with max_waiting, bounds the requests in flight
  // CORS (vLLM's --allowed-origins/-methods/-headers): off while origins is
  // empty; "*" allows any. Preflights (OPTIONS) never need the API key.
  std::vector<std::string> allowed_origins;
  std::vector<std::string> allowed_methods = {"*"};
  std::vector<std::string> allowed_headers = {"*"};
};

// A vLLM list flag's value: a JSON array of strings ('["http://a", "*"]').
// Throws InputError naming `flag` otherwise.
std::vector<std::string> parse_string_list_flag(const std::string& flag, const std::string& value);

// After the grace, cancelled requests get this long to write their last
// chunk; then every connection is closed (docs/server.md "Cancellation and shutdown").
inline constexpr double kShutdownFlushSeconds = 2.0;

class HttpServer {
 public:
  // Takes ownership of the engine and tokenizer. `ctx` is completed here
  // (tokenizer, vocab, max_model_len).
  HttpServer(std::unique_ptr<Engine> engine, std::unique_ptr<Tokenizer> tokenizer, ModelContext ctx,
             ServerOptions opts);
  ~HttpServer();
  // Binds; returns the port (throws InputError when the address is taken).
  int bind();
  // Serves until shutdown() (blocks).
  void serve();
  // From any thread (the signal thread): refuse new requests, let running ones
  // finish within the grace period, cancel the rest, then stop serving.
  void shutdown();
  // Called once (from the engine loop's thread) when the engine can no longer
  // run: the tensor-parallel group failed (docs/tp.md "The watchdog"). Open
  // requests have had their 503; the callback should make some other thread
  // call shutdown(). Set before serve().
  void on_engine_failure(std::function<void()> f);
  // That failure (a RankFailure), or null.
  std::exception_ptr engine_failure() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Constant-time comparison (the time depends on the lengths only).
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace fp8kv::server
