// `fp8kv bench serve`: load a running `fp8kv serve` (or any OpenAI-compatible
// completions server that takes token-id prompts) with streamed requests, as
// `vllm bench serve --dataset-name random` does, and report vLLM's result
// names (docs/server.md "bench serve").
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>

#include "cli/commands.h"
#include "cli/progress.h"
#include "io/errors.h"
#include "io/user_files.h"
#include "model/config.h"
#include "numerics/version.h"
#include "server/bench_client.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv::cli {
namespace {

namespace fs = std::filesystem;

struct BenchServeArgs {
  server::BenchServeSettings s;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string base_url;
  std::string request_rate = "inf";
  std::string tokenizer;
  std::string dataset_name = "random";
  bool save_result = false;
  std::string result_dir;
  std::string result_filename;
  bool json = false;
};

// The tokenizer of the random prompts: --tokenizer, else --model as a
// directory with a tokenizer.json; null when neither.
std::unique_ptr<Tokenizer> tokenizer_for(const BenchServeArgs& a) {
  if (!a.tokenizer.empty()) return Tokenizer::load(a.tokenizer);
  const fs::path m(a.s.model);
  if (fs::is_directory(m) && fs::exists(m / "tokenizer.json")) return Tokenizer::load(m);
  return nullptr;
}

// Vocabulary of the random prompt ids: the tokenizer's, else --model's
// config.json vocab_size (what `bench throughput` draws from).
int vocab_size_for(const BenchServeArgs& a, const Tokenizer* tok) {
  if (tok) return tok->vocab_size();
  const fs::path m(a.s.model);
  if (fs::is_directory(m) && fs::exists(m / "config.json")) return load_model_config(m).vocab_size;
  throw UsageError(fmt::format(
      "bench serve: random prompts need a vocabulary: give --tokenizer PATH (a tokenizer directory or "
      "tokenizer.json), or --model naming a model directory (served model: '{}')",
      a.s.model));
}

double parse_rate(const std::string& r) {
  if (r == "inf" || r == "Inf" || r == "INF") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double v = std::strtod(r.c_str(), &end);
  if (end == r.c_str() || *end != '\0' || !(v > 0) || !std::isfinite(v))
    throw UsageError(fmt::format("--request-rate: '{}' is not a positive number or inf", r));
  return v;
}

// Writes `text` to `path` through a temporary file and a rename: never a
// partial file.
void write_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw InputError(fmt::format("--result-filename: cannot write {}", tmp.string()));
    f << text;
    f.close();
    if (!f) throw InputError(fmt::format("--result-filename: writing {} failed", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw InputError(fmt::format("--result-filename: cannot rename to {}", path.string()));
  }
}

std::string date_stamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// The result file is checked before the run (docs/design.md: every output
// before any computation; issue 37: a missing --result-dir failed after the
// whole run). The directory must exist and take a probe file; a named
// result file must be new or a regular file. Without --save-result nothing
// is written (vLLM's rule), so --result-dir / --result-filename alone are
// refused rather than ignored.
void check_result_path(const BenchServeArgs& a) {
  if (!a.save_result) {
    if (!a.result_dir.empty() || !a.result_filename.empty())
      throw UsageError(fmt::format("{} writes nothing without --save-result: add --save-result, or drop it",
                                   !a.result_dir.empty() ? "--result-dir" : "--result-filename"));
    return;
  }
  const fs::path dir = a.result_dir.empty() ? fs::path(".") : fs::path(a.result_dir);
  if (a.result_filename.empty()) {
    check_writable_dir(dir, a.result_dir.empty() ? "." : a.result_dir, "--result-dir");
    return;
  }
  const fs::path file = a.result_dir.empty() ? fs::path(a.result_filename) : dir / a.result_filename;
  if (!a.result_dir.empty()) check_writable_dir(dir, a.result_dir, "--result-dir");
  check_output_file(file.string(), "--result-filename");
}

int run_bench_serve(BenchServeArgs a) {
  check_result_path(a);
  if (a.dataset_name != "random")
    throw UsageError(fmt::format("--dataset-name: only 'random' is supported, not '{}'", a.dataset_name));
  a.s.request_rate = parse_rate(a.request_rate);
  a.s.base_url = a.base_url.empty() ? fmt::format("http://{}:{}", a.host, a.port) : a.base_url;
  while (!a.s.base_url.empty() && a.s.base_url.back() == '/') a.s.base_url.pop_back();
  if (a.s.base_url.rfind("http://", 0) != 0)
    throw UsageError(fmt::format("--base-url: '{}' must start with http:// (no TLS in this client)", a.s.base_url));
  if (a.s.endpoint.empty() || a.s.endpoint[0] != '/')
    throw UsageError(fmt::format("--endpoint: '{}' must start with /", a.s.endpoint));
  if (a.s.api_key.empty()) {
    if (const char* k = std::getenv("OPENAI_API_KEY")) a.s.api_key = k;
  }
  if (a.s.model.empty()) a.s.model = server::query_served_model(a.s);
  const std::unique_ptr<Tokenizer> tok = tokenizer_for(a);
  a.s.vocab_size = vocab_size_for(a, tok.get());
  if (server::is_chat_endpoint(a.s.endpoint)) {
    // vLLM's openai-chat backend: each prompt as text in one user message.
    if (!tok)
      throw UsageError(fmt::format("--endpoint {}: chat prompts are text: give --tokenizer PATH to decode the random "
                                   "token ids (or --model naming a directory with tokenizer.json)",
                                   a.s.endpoint));
    const Tokenizer* t = tok.get();
    a.s.detokenize = [t](const std::vector<int>& ids) { return t->decode(ids, /*skip_special_tokens=*/true); };
  }

  Progress progress("bench serve", "requests");
  a.s.progress = std::ref(progress);
  const server::BenchServeRun r = server::run_bench_serve(a.s);
  nlohmann::ordered_json j = server::summarize(r, a.s);
  j["date"] = date_stamp();
  j["tokenizer_id"] = a.tokenizer.empty() ? a.s.model : a.tokenizer;
  j["fp8kv_version"] = version_string();

  if (a.save_result) {
    std::string name = a.result_filename;
    if (name.empty()) {
      std::string m = fs::path(a.s.model).filename().string();
      if (m.empty()) m = "model";
      name = fmt::format("fp8kv-{}qps-{}-{}.json", a.request_rate, m, j["date"].get<std::string>());
    }
    fs::path p = a.result_dir.empty() ? fs::path(name) : fs::path(a.result_dir) / name;
    write_atomically(p, dump_json(j) + "\n");
  }
  if (a.json) {
    std::printf("%s\n", dump_json(j).c_str());
  } else {
    auto f = [&](const char* k) { return j[k].get<double>(); };
    std::printf("============ Serving Benchmark Result ============\n");
    std::printf("%-40s %10d\n", "Successful requests:", j["completed"].get<int>());
    std::printf("%-40s %10d\n", "Failed requests:", j["failed"].get<int>());
    std::printf("%-40s %10.2f\n", "Benchmark duration (s):", f("duration"));
    std::printf("%-40s %10lld\n", "Total input tokens:", static_cast<long long>(j["total_input_tokens"].get<int64_t>()));
    std::printf("%-40s %10lld\n", "Total generated tokens:",
                static_cast<long long>(j["total_output_tokens"].get<int64_t>()));
    std::printf("%-40s %10.2f\n", "Request throughput (req/s):", f("request_throughput"));
    std::printf("%-40s %10.2f\n", "Output token throughput (tok/s):", f("output_throughput"));
    std::printf("%-40s %10.2f\n", "Total Token throughput (tok/s):", f("total_token_throughput"));
    for (const char* m : {"ttft", "tpot", "itl", "e2el"}) {
      std::printf("%-40s %10.2f\n", fmt::format("Mean {} (ms):", m).c_str(), f(fmt::format("mean_{}_ms", m).c_str()));
      std::printf("%-40s %10.2f\n", fmt::format("Median {} (ms):", m).c_str(),
                  f(fmt::format("median_{}_ms", m).c_str()));
      std::printf("%-40s %10.2f\n", fmt::format("P99 {} (ms):", m).c_str(), f(fmt::format("p99_{}_ms", m).c_str()));
    }
    std::printf("==================================================\n");
    for (const auto& e : j["errors"]) {
      if (!e.get<std::string>().empty()) {
        std::fprintf(stderr, "first error: %s\n", e.get<std::string>().c_str());
        break;
      }
    }
  }
  return j["failed"].get<int>() == 0 ? 0 : 1;
}

Registrar reg_bench_serve([](CLI::App& app) {
  static BenchServeArgs a;  // lives for the program
  auto* s = bench_parent(app)->add_subcommand(
      "serve", "Load a running server with streamed random-prompt completions (vllm bench serve's flags and results)");
  s->add_option("--host", a.host, "Server host (default 127.0.0.1)");
  s->add_option("--port", a.port, "Server port (default 8000)")->check(in_range(1, 65535));
  s->add_option("--base-url", a.base_url, "http://HOST:PORT (overrides --host/--port)");
  s->add_option("--endpoint", a.s.endpoint, "Route: /v1/completions (default; token-id prompts) or /v1/chat/completions (the prompts decoded to text)");
  s->add_option("--model", a.s.model, "Model name sent in requests (default: the server's /v1/models)")
      ->check(utf8_text());
  s->add_option("--tokenizer", a.tokenizer, "Tokenizer directory or tokenizer.json: the vocabulary of the random prompts");
  s->add_option("--dataset-name", a.dataset_name, "Only 'random' (random token ids)");
  s->add_option("--num-prompts", a.s.num_prompts, "Requests in all (default 1000)")->check(at_least(1));
  s->add_option("--request-rate", a.request_rate, "Requests per second (Poisson arrivals), or inf: all at once");
  s->add_option("--max-concurrency", a.s.max_concurrency, "Requests in flight at most (default: no limit)")
      ->check(at_least(1));
  s->add_option("--random-input-len", a.s.input_len, "Prompt tokens per request (default 1024)")
      ->check(at_least(1));
  s->add_option("--random-output-len", a.s.output_len, "max_tokens per request (default 128)")
      ->check(at_least(1));
  s->add_option("--seed", a.s.seed, "Seed of the random prompts and arrivals (default 0; -1: random, logged)")
      ->transform(seed_rule());
  s->add_flag("--ignore-eos", a.s.ignore_eos, "Send ignore_eos: generate --random-output-len tokens each");
  s->add_option("--num-warmups", a.s.num_warmups, "Untimed requests before the run (after the test request)")
      ->check(at_least(0));
  s->add_option("--api-key", a.s.api_key, "Bearer key (default: $OPENAI_API_KEY)");
  s->add_option("--request-timeout", a.s.timeout_s, "Seconds a request may wait for its next chunk (default 3600)")
      ->check(greater_than(0));
  s->add_flag("--save-result", a.save_result, "Write the result JSON (vLLM's names) to a file");
  s->add_option("--result-dir", a.result_dir, "Folder of the result file, which must exist (default: the current one)")
      ->check(non_empty("a directory"));
  s->add_option("--result-filename", a.result_filename, "Result file name (default fp8kv-RATEqps-MODEL-DATE.json)")
      ->check(non_empty("a file name"));
  s->add_flag("--json", a.json, "Print the result JSON instead of the table");
  set_action(s, [] { return run_bench_serve(a); });
});

}  // namespace
}  // namespace fp8kv::cli
