// `fp8kv bench serve`: an HTTP load client in the spirit of `vllm bench
// serve` (docs/server.md "bench serve"). It sends N streamed completions with
// random token-id prompts at a given rate (or all at once) to a running
// server, times the first chunk (TTFT) and the gaps between chunks (ITL), and
// reports vLLM's result names.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp8kv::server {

struct BenchServeSettings {
  std::string base_url = "http://127.0.0.1:8000";  // scheme://host:port
  std::string endpoint = "/v1/completions";
  std::string model;      // the "model" field sent (the served name)
  std::string api_key;    // empty: no Authorization header
  int num_prompts = 1000;
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s; inf: all at once
  int max_concurrency = 0;  // 0: no limit
  int input_len = 1024;
  int output_len = 128;
  uint64_t seed = 0;
  bool ignore_eos = false;
  int vocab_size = 0;       // random prompt ids are drawn from [0, vocab_size)
  int num_warmups = 0;      // untimed requests after the initial test request
  double timeout_s = 3600;  // per request (read timeout between chunks)
  // Chat endpoints (vLLM's --backend openai-chat): the random ids decoded to
  // text, sent as one user message; required when is_chat_endpoint(endpoint).
  // The input tokens counted are then the server's usage.prompt_tokens (the
  // text re-tokenized, inside the chat template), not --random-input-len.
  std::function<std::string(const std::vector<int>&)> detokenize;
  // Called with (requests finished, num_prompts) as the timed requests end
  // (one call at a time, from the request threads); empty: no progress.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// True for a chat completions route (".../chat/completions").
bool is_chat_endpoint(const std::string& endpoint);

// One request's measurements (times in seconds).
struct RequestOutcome {
  bool success = false;
  std::string error;
  int prompt_len = 0;
  int output_tokens = 0;      // usage.completion_tokens (else the chunks with text)
  double ttft = 0.0;          // send -> first chunk with choices
  double latency = 0.0;       // send -> [DONE]
  std::vector<double> itl;    // gaps between successive chunks with choices
  std::string finish_reason;
};

// Random prompts as bench throughput draws them (src/bench/runner.cpp):
// mt19937_64(seed), each id = rng() % vocab_size.
std::vector<std::vector<int>> random_prompts(int n, int len, int vocab_size, uint64_t seed);

// Send offsets from the start (seconds): all 0 for an infinite rate, else a
// Poisson process (exponential gaps of mean 1 / rate, as vLLM with
// burstiness 1), seeded with `seed`.
std::vector<double> arrival_times(int n, double rate, uint64_t seed);

// Splits an SSE byte stream into `data:` payloads (across arbitrary chunk
// boundaries). feed() returns the payloads completed by `bytes`.
class SseSplitter {
 public:
  std::vector<std::string> feed(const char* data, size_t len);

 private:
  std::string buf_;
};

// One streamed request (stream_options.include_usage); blocking; never throws.
RequestOutcome send_completion(const BenchServeSettings& s, const std::vector<int>& prompt);

// The served model name from GET /v1/models (the first id). Throws
// InputError when the server cannot be reached or answers badly.
std::string query_served_model(const BenchServeSettings& s);

struct BenchServeRun {
  std::vector<RequestOutcome> outcomes;
  double duration_s = 0.0;  // first send -> last request done
};

// The initial test request (must succeed, as in vLLM), the warm-ups, then the
// timed run.
BenchServeRun run_bench_serve(const BenchServeSettings& s);

// numpy.percentile's default (linear) interpolation; 0 for an empty input.
double percentile(std::vector<double> v, double p);

// vLLM's result JSON: completed, failed, total_input_tokens,
// total_output_tokens, request_throughput, output_throughput,
// total_token_throughput, duration, {mean,median,std,p99}_{ttft,tpot,itl,e2el}_ms,
// and the per-request input_lens, output_lens, ttfts, itls, errors.
nlohmann::ordered_json summarize(const BenchServeRun& r, const BenchServeSettings& s);

}  // namespace fp8kv::server
