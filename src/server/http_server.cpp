#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include "server/log.h"

#include <sys/socket.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <random>

#include "io/errors.h"
#include "numerics/version.h"
#include "server/api_error.h"
#include "server/connections.h"
#include "server/engine_loop.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "server/peer_socket.h"

namespace fp8kv::server {

using nlohmann::json;

bool constant_time_equal(std::string_view a, std::string_view b) {
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

std::vector<std::string> parse_string_list_flag(const std::string& flag, const std::string& value) {
  json j;
  try {
    j = json::parse(value);
  } catch (const json::exception&) {
    throw InputError(fmt::format("{}: expected a JSON array of strings (as vLLM: '[\"http://localhost:3000\"]'), got '{}'",
                                 flag, value));
  }
  std::vector<std::string> out;
  if (!j.is_array()) throw InputError(fmt::format("{}: expected a JSON array of strings, got '{}'", flag, value));
  for (const auto& x : j) {
    if (!x.is_string() || x.get<std::string>().empty())
      throw InputError(fmt::format("{}: every element must be a non-empty string, got '{}'", flag, value));
    out.push_back(x.get<std::string>());
  }
  return out;
}

namespace {

// The media type of a Content-Type value, lower-cased, without parameters.
std::string media_type(const std::string& content_type) {
  std::string t = content_type.substr(0, content_type.find(';'));
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
  size_t i = 0;
  while (i < t.size() && (t[i] == ' ' || t[i] == '\t')) ++i;
  t = t.substr(i);
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return t;
}

bool listed(const std::vector<std::string>& list, const std::string& v) {
  for (const auto& x : list)
    if (x == "*" || x == v) return true;
  return false;
}

std::string joined(const std::vector<std::string>& list) {
  std::string s;
  for (const auto& x : list) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// How often a non-streaming request without news checks its connection.
constexpr std::chrono::milliseconds kDisconnectPoll{200};

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(dump_json(e.body()), "application/json");
}

void send_json(httplib::Response& res, const json& j) { res.set_content(dump_json(j), "application/json"); }

json parse_body(const httplib::Request& req) {
  try {
    return json::parse(req.body);
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
}

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}{:04x}", prefix, rng(), (counter++) & 0xffff);
}

// Every admitted request may hold a worker while it runs (a stream, or a
// non-streamed wait); 64 more answer the quick routes and the refusals.
ConnectionLimits connection_limits(const ServerOptions& o) {
  ConnectionLimits l;
  l.max_connections = o.max_connections;
  l.max_body_bytes = o.max_body_bytes;
  l.max_workers = o.max_num_seqs + o.max_waiting + 64;
  return l;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Everything one generation request needs while its response is written
// (the streaming provider outlives the handler).
struct Stream {
  ParsedRequest req;
  std::shared_ptr<Channel> channel;
  std::unique_ptr<Generation> gen;
  bool first = true;
  bool finished = false;
};

// A failed request's error: 503 when the tensor-parallel group failed (the
// server is exiting; docs/tp.md "The watchdog"), else 500.
ApiError channel_error(const Channel& ch, const std::string& message) { return ApiError(ch.error_status(), message); }

}  // namespace

struct HttpServer::Impl {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Tokenizer> tokenizer;
  ModelContext ctx;
  ServerOptions opts;
  Metrics metrics;
  std::unique_ptr<EngineLoop> loop;
  FramedServer svr;
  std::chrono::steady_clock::time_point stop_deadline{};  // set by shutdown() before svr.stop()
  std::atomic<int> open_streams{0};
  int64_t started = unix_now();
  std::vector<int> eos_token_ids;  // read once here: HTTP threads make no engine call, not even config()
  std::function<void()> on_engine_failure;  // set before serve(); called on the loop thread

  Impl(std::unique_ptr<Engine> e, std::unique_ptr<Tokenizer> t, ModelContext c, ServerOptions o)
      : engine(std::move(e)),
        tokenizer(std::move(t)),
        ctx(std::move(c)),
        opts(std::move(o)),
        metrics(ctx.served_name),
        svr(connection_limits(opts)) {
    ctx.tokenizer = tokenizer.get();
    ctx.vocab_size = engine->config().vocab_size;
    ctx.max_model_len = engine->max_model_len();
    ctx.max_prompt_bytes = prompt_byte_bound(*tokenizer, ctx.max_model_len);
    eos_token_ids = engine->config().eos_token_ids;
    loop = std::make_unique<EngineLoop>(*engine, metrics, opts.max_num_seqs + opts.max_waiting, [this] {
      if (on_engine_failure) on_engine_failure();
    });
    routes();
  }

  // Adds the CORS response headers when the request's Origin is allowed;
  // for a preflight, also the allowed method and headers, and a 204. Returns
  // whether the origin was allowed.
  bool cors(const httplib::Request& req, httplib::Response& res, bool preflight) const {
    if (opts.allowed_origins.empty() || !req.has_header("Origin")) return false;
    const std::string origin = req.get_header_value("Origin");
    if (!listed(opts.allowed_origins, origin)) return false;
    const bool any = opts.allowed_origins.size() == 1 && opts.allowed_origins[0] == "*";
    res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
    if (!any) res.set_header("Vary", "Origin");
    if (!preflight) return true;
    const std::string method = req.get_header_value("Access-Control-Request-Method");
    const std::string headers = req.get_header_value("Access-Control-Request-Headers");
    res.set_header("Access-Control-Allow-Methods",
                   listed(opts.allowed_methods, "*") ? (method.empty() ? "GET, POST, OPTIONS" : method)
                                                     : joined(opts.allowed_methods));
    if (listed(opts.allowed_headers, "*")) {
      if (!headers.empty()) res.set_header("Access-Control-Allow-Headers", headers);
    } else {
      res.set_header("Access-Control-Allow-Headers", joined(opts.allowed_headers));
    }
    res.set_header("Access-Control-Max-Age", "600");
    res.status = 204;
    return true;
  }

  bool authorized(const httplib::Request& req) const {
    if (opts.api_key.empty()) return true;
    const std::string h = req.get_header_value("Authorization");
    const std::string_view bearer = "Bearer ";
    const std::string_view given =
        h.compare(0, bearer.size(), bearer) == 0 ? std::string_view(h).substr(bearer.size()) : std::string_view();
    return constant_time_equal(given, opts.api_key);
  }

  // Wraps a handler: ApiError -> its status and body; anything else -> 500.
  template <class F>
  httplib::Server::Handler guarded(F f) {
    return [f](const httplib::Request& req, httplib::Response& res) {
      try {
        f(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const std::exception& e) {
        log().error("{} {}: {}", req.method, req.path, e.what());
        send_error(res, ApiError(500, std::string("internal error: ") + e.what()));
      }
    };
  }

  void routes() {
    // Order: CORS headers (when enabled), preflights (no key), the key, then
    // JSON bodies must say application/json (a cross-site "simple" request
    // can only send text/plain, form or multipart bodies).
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      using HR = httplib::Server::HandlerResponse;
      const bool preflight = req.method == "OPTIONS";
      if (cors(req, res, preflight) && preflight) return HR::Handled;
      if (preflight) {
        res.status = 204;  // CORS off (or this origin not allowed): no Access-Control-Allow-* headers
        return HR::Handled;
      }
      if (req.path == "/health" || req.path == "/metrics" || req.path == "/version") return HR::Unhandled;
      if (!authorized(req)) {
        send_error(res, ApiError(401, "missing or invalid API key (send Authorization: Bearer KEY)", {},
                                 "authentication_error", "invalid_api_key"));
        return HR::Handled;
      }
      if (req.method == "POST" && media_type(req.get_header_value("Content-Type")) != "application/json") {
        const std::string given = req.get_header_value("Content-Type");
        send_error(res, ApiError(415, fmt::format("Content-Type must be application/json (got {})",
                                                  given.empty() ? "none" : "'" + given + "'"),
                                 {}, "invalid_request_error"));
        return HR::Handled;
      }
      return HR::Unhandled;
    });
    // Statuses httplib sets itself (404 route, 413 body, 400 malformed HTTP) get the OpenAI error body.
    svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      std::string msg;
      if (res.status == 404) msg = fmt::format("no route {} {}", req.method, req.path);
      else if (res.status == 413) msg = "the request body is too large";
      else msg = fmt::format("HTTP {}", res.status);
      send_error(res, ApiError(res.status, msg));
      return httplib::Server::HandlerResponse::Handled;
    }));
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
      send_error(res, ApiError(500, "internal error"));
    });

    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.status = loop->draining() ? 503 : 200;
    });
    svr.Get("/version", [](const httplib::Request&, httplib::Response& res) {
      send_json(res, {{"version", version_string()}});
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics.render(), "text/plain; version=0.0.4");
    });
    svr.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
      send_json(res, {{"object", "list"}, {"data", json::array({model_card()})}});
    }));
    // client.models.retrieve(id); the served name may hold slashes (a path).
    svr.Get("/v1/models/(.+)", guarded([this](const httplib::Request& req, httplib::Response& res) {
      check_model_field({{"model", req.matches[1].str()}}, ctx);
      send_json(res, model_card());
    }));
    svr.Post("/tokenize", guarded([this](const httplib::Request& req, httplib::Response& res) { tokenize(req, res); }));
    svr.Post("/detokenize", guarded([this](const httplib::Request& req, httplib::Response& res) { detokenize(req, res); }));
    svr.Post("/v1/completions",
             guarded([this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); }));
    svr.Post("/v1/chat/completions",
             guarded([this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); }));
  }

  json model_card() const {
    return {{"id", ctx.served_name},     {"object", "model"},   {"created", started},
            {"owned_by", "fp8kv"},       {"root", ctx.model_dir.string()}, {"parent", nullptr},
            {"max_model_len", ctx.max_model_len}};
  }

  void tokenize(const httplib::Request& hreq, httplib::Response& res) {
    const json body = parse_body(hreq);
    if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
    check_model_field(body, ctx);
    bool add_special = true, token_strs = false, add_generation_prompt = true;
    bool have_prompt = false, have_messages = false;
    for (const auto& [k, v] : body.items()) {
      if (v.is_null() || k == "model") continue;
      if (k == "add_special_tokens" || k == "return_token_strs" || k == "add_generation_prompt") {
        if (!v.is_boolean()) throw bad_field(k, "must be a boolean");
        (k == "add_special_tokens" ? add_special : k == "return_token_strs" ? token_strs : add_generation_prompt) =
            v.get<bool>();
      } else if (k == "prompt") {
        if (!v.is_string()) throw bad_field(k, "must be a string");
        have_prompt = true;
      } else if (k == "messages") {
        if (!v.is_array()) throw bad_field(k, "must be an array of messages");
        have_messages = true;
      } else {
        throw bad_field(k, "is not a supported field of /tokenize");
      }
    }
    if (have_prompt == have_messages) throw bad_field("prompt", "give either prompt or messages");
    std::vector<int> ids;
    if (have_messages) {
      // As a chat request renders it: the template, then no added special tokens (vLLM).
      if (!ctx.chat) throw ApiError(400, ctx.chat_unavailable_reason, "messages");
      const auto messages = normalize_chat_messages(nlohmann::ordered_json::parse(hreq.body)["messages"]);
      std::string text;
      try {
        text = ctx.chat(messages, add_generation_prompt, nlohmann::ordered_json::object());
      } catch (const std::exception& e) {
        throw bad_field("messages", std::string("the chat template failed: ") + e.what());
      }
      add_special = false;
      try {
        ids = tokenizer->encode(text, false);
      } catch (const InputError& e) {
        throw bad_field("messages", e.what());
      }
    } else {
      try {
        ids = tokenizer->encode(body["prompt"].get<std::string>(), add_special);
      } catch (const InputError& e) {
        throw bad_field("prompt", e.what());
      }
    }
    json out = {{"count", ids.size()}, {"max_model_len", ctx.max_model_len}, {"tokens", ids}, {"token_strs", nullptr}};
    if (token_strs) {
      json s = json::array();
      for (int id : ids) s.push_back(tokenizer->id_to_token(id).value_or(""));
      out["token_strs"] = s;
    }
    send_json(res, out);
  }

  void detokenize(const httplib::Request& hreq, httplib::Response& res) {
    const json body = parse_body(hreq);
    if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
    check_model_field(body, ctx);
    std::vector<int> ids;
    bool have = false;
    for (const auto& [k, v] : body.items()) {
      if (v.is_null() || k == "model") continue;
      if (k != "tokens") throw bad_field(k, "is not a supported field of /detokenize");
      if (!v.is_array()) throw bad_field(k, "must be an array of token ids");
      for (const auto& t : v) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tokenizer->vocab_size())
          throw bad_field(k, fmt::format("token ids must be integers in [0, {})", tokenizer->vocab_size()));
        ids.push_back(t.get<int>());
      }
      have = true;
    }
    if (!have) throw bad_field("tokens", "is required");
    send_json(res, {{"prompt", tokenizer->decode(ids, false)}});
  }

  void generate(const httplib::Request& hreq, httplib::Response& res, bool chat) {
    const json body = parse_body(hreq);
    auto st = std::make_shared<Stream>();
    if (chat) {
      const auto ordered = nlohmann::ordered_json::parse(hreq.body);  // valid: parse_body accepted it
      st->req = parse_chat_request(body, ctx, &ordered);
    } else {
      st->req = parse_completion_request(body, ctx);
    }
    st->gen = std::make_unique<Generation>(st->req, *tokenizer, eos_token_ids, ctx.served_name,
                                           random_id(chat ? "chatcmpl" : "cmpl"), unix_now());
    st->channel = loop->submit(st->req.prompt, st->req.gen);
    if (!st->req.stream) {
      // A client that goes away cancels its request: every kDisconnectPoll
      // the connection is checked (src/server/peer_socket.h).
      std::vector<StepEvent> evs;
      int fd = -2;  // -2: not looked up yet
      auto next_check = std::chrono::steady_clock::now() + kDisconnectPoll;
      while (!st->gen->done()) {
        evs.clear();
        const std::optional<bool> got = st->channel->wait_for(evs, kDisconnectPoll);
        if (std::chrono::steady_clock::now() >= next_check) {
          next_check = std::chrono::steady_clock::now() + kDisconnectPoll;
          if (fd == -2) fd = current_connection_socket();
          if (connection_closed(fd)) {
            loop->cancel(st->channel);
            log().info("client {}:{} disconnected: request cancelled", hreq.remote_addr, hreq.remote_port);
            res.status = 499;  // nginx's "client closed request"; nobody reads it
            return;
          }
        }
        if (!got) continue;
        if (!*got) break;
        st->gen->consume(evs);
        if (st->gen->stop_matched()) loop->cancel(st->channel);
      }
      if (auto err = st->channel->error()) throw channel_error(*st->channel, *err);
      if (!st->gen->done()) throw ApiError(500, "the request ended without a finish reason", {}, "server_error");
      send_json(res, chat ? st->gen->chat_response() : st->gen->completion_response());
      return;
    }
    ++open_streams;
    EngineLoop* lp = loop.get();
    std::atomic<int>* open = &open_streams;
    res.set_chunked_content_provider(
        "text/event-stream",
        [st, lp](size_t, httplib::DataSink& sink) {
          if (st->finished) {
            sink.done();
            return true;
          }
          std::vector<StepEvent> evs;
          std::string out;
          if (!st->channel->wait(evs)) {
            if (auto err = st->channel->error()) {
              out = sse_data(channel_error(*st->channel, *err).body()) + "data: [DONE]\n\n";
            } else {
              out = "data: [DONE]\n\n";
            }
            st->finished = true;
          } else {
            const Delta d = st->gen->consume(evs);
            if (st->gen->stop_matched()) lp->cancel(st->channel);
            out = st->gen->sse(d, st->first);
            st->first = false;
            st->finished = st->gen->done();
          }
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            lp->cancel(st->channel);  // the client went away
            return false;
          }
          if (st->finished) sink.done();
          return true;
        },
        [st, lp, open](bool success) {
          if (!success || !st->gen->done()) lp->cancel(st->channel);
          --*open;
        });
  }
};

HttpServer::HttpServer(std::unique_ptr<Engine> engine, std::unique_ptr<Tokenizer> tokenizer, ModelContext ctx,
                       ServerOptions opts)
    : impl_(std::make_unique<Impl>(std::move(engine), std::move(tokenizer), std::move(ctx), std::move(opts))) {}

HttpServer::~HttpServer() {
  if (impl_->loop) impl_->loop->drain(std::chrono::seconds(0));
}

int HttpServer::bind() {
  const auto& o = impl_->opts;
  // Exclusive: httplib's default sets SO_REUSEPORT, with which a second
  // server on the same port starts and the kernel splits the connections
  // between the two. SO_REUSEADDR only lets a restart reuse a port whose old
  // connections are in TIME_WAIT; a port someone listens on stays refused.
  impl_->svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  int port = o.port;
  errno = 0;
  if (port == 0) {
    port = impl_->svr.bind_to_any_port(o.host);
    if (port < 0)
      throw InputError(fmt::format("--host {}: cannot bind: {}", o.host, errno ? std::strerror(errno) : "unknown error"));
  } else if (!impl_->svr.bind_to_port(o.host, port)) {
    const int err = errno;
    throw InputError(fmt::format("--host {} --port {}: cannot bind: {}", o.host, port,
                                 err == EADDRINUSE ? "the port is already in use (is another server running?)"
                                 : err            ? std::strerror(err)
                                                  : "address not available"));
  }
  // uvicorn's (vLLM's) backlog: a burst of clients must not wait on SYN retries.
  if (!raise_listen_backlog(port, 2048)) log().warn("could not raise the listen backlog (port {})", port);
  return port;
}

void HttpServer::serve() {
  Impl& s = *impl_;
  s.svr.listen_after_bind();
  // Stopped: every connection is closed by the deadline shutdown() set (now,
  // when serving ended otherwise). A worker still inside a handler a second
  // later (a render or tokenization that cannot be interrupted) must not keep
  // the process: it exits here, as the grace promised.
  const auto deadline = s.stop_deadline == std::chrono::steady_clock::time_point{} ? std::chrono::steady_clock::now()
                                                                                   : s.stop_deadline;
  if (!s.svr.close_all(deadline)) {
    log().warn("a request handler outlived the shutdown grace: exiting without it");
    std::fflush(nullptr);
    std::_Exit(0);
  }
}

void HttpServer::on_engine_failure(std::function<void()> f) { impl_->on_engine_failure = std::move(f); }

std::exception_ptr HttpServer::engine_failure() const { return impl_->loop->fatal(); }

void HttpServer::shutdown() {
  Impl& s = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  const auto grace = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s.opts.shutdown_grace_s));
  log().info("shutting down: {} requests in flight, grace {} s", s.loop->in_flight(), s.opts.shutdown_grace_s);
  s.svr.stop_keep_alive();
  s.loop->drain(std::chrono::duration<double>(s.opts.shutdown_grace_s));
  // Open streams write their last chunks (their requests have ended), for at
  // most kShutdownFlushSeconds past the grace.
  const auto deadline = t0 + grace + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                         std::chrono::duration<double>(kShutdownFlushSeconds));
  while (s.open_streams.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  s.stop_deadline = deadline;
  s.svr.stop();
}

}  // namespace fp8kv::server
