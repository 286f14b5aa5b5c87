// `fp8kv serve MODEL_DIR`: the OpenAI-compatible HTTP server on one engine
// (docs/server.md). SIGTERM / SIGINT: refuse new requests, let running ones
// finish within --shutdown-grace, cancel the rest, exit 0.
#include <fmt/format.h>
#include <unistd.h>
#include "server/log.h"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <thread>

#include "cli/commands.h"
#include "cli/text_input.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "io/errors.h"
#include "io/fs_util.h"
#include "server/http_server.h"
#include "server/request.h"
#include "tokenizer/tokenizer.h"
#if __has_include("template/chat_template.h")
#include <fstream>
#include <nlohmann/json.hpp>

#include "template/chat_template.h"
#define FP8KV_SERVE_CHAT 1
#endif

namespace fp8kv::cli {
namespace {

int g_signal_pipe[2] = {-1, -1};
extern "C" void on_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  const ssize_t r = write(g_signal_pipe[1], &b, 1);  // async-signal-safe
  (void)r;
}

#ifdef FP8KV_SERVE_CHAT
// The special tokens transformers passes to apply_chat_template
// (tokenizer_config.json: a string or {"content": ...}).
nlohmann::ordered_json special_token_vars(const std::filesystem::path& model_dir) {
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  const std::filesystem::path path = model_dir / "tokenizer_config.json";
  // Absent: no variables; a FIFO or device would block or never end, so
  // anything but a regular file is refused (docs/robustness.md).
  if (!optional_file(path)) return vars;
  const nlohmann::json cfg = read_json_file(path);
  for (const char* k : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (!cfg.contains(k)) continue;
    const auto& v = cfg[k];
    if (v.is_string()) vars[k] = v;
    else if (v.is_object() && v.contains("content") && v["content"].is_string()) vars[k] = v["content"];
  }
  return vars;
}

// The chat renderer for the server: the model's template (or --chat-template
// FILE), parsed once at start, so a template outside the subset fails here.
void setup_chat(server::ModelContext& ctx, const std::string& model, const std::string& override_file) {
  auto src = tmpl::find_chat_template(model, override_file);
  if (!src) {
    ctx.chat_unavailable_reason =
        "this model has no chat template (chat_template.jinja or tokenizer_config.json) and the server was started "
        "without --chat-template";
    return;
  }
  // A template's text must be UTF-8 (its output is tokenized): refused at
  // start naming the flag or the file, not per request.
  if (!override_file.empty())
    check_utf8_option_text(src->source, override_file, "--chat-template");
  else if (const size_t bad = utf8::first_invalid(src->source); bad != std::string_view::npos)
    throw InputError(fmt::format("{}: chat template not valid UTF-8 (first invalid byte 0x{:02X} at byte offset {})",
                                 src->origin, static_cast<unsigned char>(src->source[bad]), bad));
  auto t = std::make_shared<const tmpl::ChatTemplate>(tmpl::ChatTemplate::load(src->source, src->origin));
  const nlohmann::ordered_json base = special_token_vars(model);
  ctx.chat = [t, base](const nlohmann::ordered_json& messages, bool add_generation_prompt,
                       const nlohmann::ordered_json& extra) {
    nlohmann::ordered_json vars = base;
    for (const auto& [k, v] : extra.items()) vars[k] = v;
    return t->render(messages, add_generation_prompt, vars);
  };
  server::log().info("chat template: {}", src->origin);
}
#endif

struct ServeArgs {
  std::string model, chat_template;
  std::string allowed_origins, allowed_methods, allowed_headers;  // JSON arrays (vLLM's form)
  server::ServerOptions server;
  EngineFlags engine;
};

int run_serve(ServeArgs& a) {
  // Threads exist before main (OpenBLAS starts its pool at load), so signals
  // cannot be masked away from them: a handler writes the signal number to a
  // pipe that one thread waits on (the self-pipe pattern).
  if (pipe(g_signal_pipe) != 0) throw std::runtime_error("pipe() failed");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that went away is a failed write, not a fatal signal

  if (a.server.port < 0 || a.server.port > 65535) throw UsageError("--port must be in [0, 65535]");
  if (a.server.max_waiting < 0) throw UsageError("--max-waiting must be >= 0");
  if (a.server.max_connections < 1) throw UsageError("--max-connections must be >= 1");
  // An empty --host bound every interface (and logged "http://:PORT"): say so instead.
  if (a.server.host.empty()) throw UsageError("--host must not be empty (0.0.0.0 listens on every interface)");
  if (!(a.server.shutdown_grace_s >= 0)) throw UsageError("--shutdown-grace must be >= 0");
  if (!a.allowed_origins.empty())
    a.server.allowed_origins = server::parse_string_list_flag("--allowed-origins", a.allowed_origins);
  if (!a.allowed_methods.empty())
    a.server.allowed_methods = server::parse_string_list_flag("--allowed-methods", a.allowed_methods);
  if (!a.allowed_headers.empty())
    a.server.allowed_headers = server::parse_string_list_flag("--allowed-headers", a.allowed_headers);
#ifndef FP8KV_SERVE_CHAT
  if (!a.chat_template.empty())
    throw UsageError("--chat-template: no chat template support in this build (docs/server.md)");
#endif

  server::ModelContext ctx;
  ctx.model_dir = a.model;
  ctx.served_name = a.server.served_model_name.empty() ? a.model : a.server.served_model_name;
  ctx.defaults = server::load_sampling_defaults(a.model);
  for (const auto& f : ctx.defaults.not_applied)
    server::log().warn("generation_config.json: {} is not supported by this server and is NOT applied", f);
  ctx.chat_unavailable_reason = "no chat template support in this build";
  // --tokenizer (a dummy-weight model directory holds only config.json): the
  // tokenizer, and its directory's chat template and special tokens.
  const std::filesystem::path tok_path = a.engine.tokenizer_path(a.model);
#ifdef FP8KV_SERVE_CHAT
  setup_chat(ctx, std::filesystem::is_directory(tok_path) ? tok_path.string() : a.model, a.chat_template);
#endif

  auto tokenizer = Tokenizer::load(tok_path);
  const EngineOptions eo = a.engine.options();
  auto engine = Engine::load(a.model, eo);
  if (!engine) return 0;  // a multi-process follower: rank 0 did the work (Engine::load)
  a.server.max_num_seqs = eo.max_num_seqs;
  server::HttpServer http(std::move(engine), std::move(tokenizer), std::move(ctx), a.server);
  const int port = http.bind();
  server::log().info("serving {} as \"{}\"", a.model, a.server.served_model_name.empty() ? a.model : a.server.served_model_name);
  server::log().info("listening on http://{}:{}", a.server.host, port);

  // The tensor-parallel group failed (a peer process gone or silent; docs/tp.md
  // "The watchdog"): the engine loop has answered its open requests with 503;
  // the signal thread stops the server, and this process exits 1.
  constexpr unsigned char kEngineFailed = 0xFE;
  http.on_engine_failure([] {
    const unsigned char b = kEngineFailed;
    if (write(g_signal_pipe[1], &b, 1) != 1) std::abort();
  });
  std::thread signals([&] {
    unsigned char sig = 0;
    while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig == 0) return;  // serving ended otherwise
    if (sig == kEngineFailed)
      server::log().error("the tensor-parallel group failed: stopping the server");
    else
      server::log().info("received {}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    http.shutdown();
  });
  http.serve();
  const unsigned char zero = 0;
  if (write(g_signal_pipe[1], &zero, 1) != 1) std::abort();  // wakes the signal thread
  signals.join();
  if (auto failure = http.engine_failure()) std::rethrow_exception(failure);  // "fp8kv: rank N lost ...", exit 1
  server::log().info("stopped");
  return 0;
}

Registrar reg_serve([](CLI::App& app) {
  add_model_command<ServeArgs>(app, "serve", "OpenAI-compatible HTTP server (docs/server.md)", run_serve, [](CLI::App* sub, ServeArgs& a) {
    sub->add_option("--host", a.server.host, "Address to bind (default 127.0.0.1)");
    sub->add_option("--port", a.server.port, "Port (0: a free port, printed on start)");
    sub->add_option("--api-key", a.server.api_key, "Require Authorization: Bearer KEY (not on /health, /metrics, /version)")
        ->check(non_empty("a key; an empty key would serve without authentication"));
    sub->add_option("--served-model-name", a.server.served_model_name, "Model name in the API (default: MODEL_DIR as given)")
        ->check(utf8_text());
    sub->add_option("--chat-template", a.chat_template, "Chat template file (Jinja)");
    sub->add_option("--max-waiting", a.server.max_waiting, "Queued requests beyond the running batch; more get 503");
    sub->add_option("--shutdown-grace", a.server.shutdown_grace_s, "Seconds running requests get to finish on SIGTERM");
    sub->add_option("--max-connections", a.server.max_connections,
                    "Open HTTP connections; the next gets a 503 and is closed (default 4096)");
    sub->add_option("--allowed-origins", a.allowed_origins,
                    "CORS: JSON array of allowed origins, '[\"*\"]' for any (default: none, CORS off)");
    sub->add_option("--allowed-methods", a.allowed_methods, "CORS: JSON array of allowed methods (default '[\"*\"]')");
    sub->add_option("--allowed-headers", a.allowed_headers, "CORS: JSON array of allowed headers (default '[\"*\"]')");
  });
});

}  // namespace
}  // namespace fp8kv::cli
