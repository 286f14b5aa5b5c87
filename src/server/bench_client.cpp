#include "server/bench_client.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "io/errors.h"

namespace fp8kv::server {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

httplib::Client make_client(const BenchServeSettings& s) {
  httplib::Client c(s.base_url);
  c.set_connection_timeout(60);
  const auto t = static_cast<time_t>(std::max(1.0, s.timeout_s));
  c.set_read_timeout(t);
  c.set_write_timeout(60);
  if (!s.api_key.empty()) c.set_bearer_token_auth(s.api_key.c_str());
  return c;
}

// A counting gate for --max-concurrency (0: open).
class Gate {
 public:
  explicit Gate(int n) : free_(n) {}
  void acquire() {
    if (!limited_) return;
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return free_ > 0; });
    --free_;
  }
  void release() {
    if (!limited_) return;
    std::lock_guard<std::mutex> l(m_);
    ++free_;
    cv_.notify_one();
  }

 private:
  int free_;
  bool limited_ = free_ > 0;
  std::mutex m_;
  std::condition_variable cv_;
};

// httplib's error names ("Connection") with what they mean, for messages
// (issue 37: "cannot reach ...: Connection" cut off its reason).
std::string describe(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "Connection: could not connect (refused, or nothing listens there: is the server running?)";
    case httplib::Error::ConnectionTimeout: return "ConnectionTimeout: the connection attempt timed out";
    case httplib::Error::Read: return "Read: the connection closed or timed out before the response was complete";
    case httplib::Error::Write: return "Write: the connection closed while the request was sent";
    case httplib::Error::BindIPAddress: return "BindIPAddress: could not bind the local address";
    case httplib::Error::Canceled: return "Canceled: the request was cancelled";
    default: return httplib::to_string(e);
  }
}

}  // namespace

std::vector<std::vector<int>> random_prompts(int n, int len, int vocab_size, uint64_t seed) {
  if (vocab_size <= 0) throw InputError("bench serve: vocabulary size must be > 0");
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int>> out(static_cast<size_t>(n), std::vector<int>(static_cast<size_t>(len)));
  for (auto& p : out)
    for (auto& x : p) x = static_cast<int>(rng() % static_cast<uint64_t>(vocab_size));
  return out;
}

std::vector<double> arrival_times(int n, double rate, uint64_t seed) {
  std::vector<double> t(static_cast<size_t>(n), 0.0);
  if (!std::isfinite(rate)) return t;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::exponential_distribution<double> gap(rate);
  double at = 0.0;
  for (int i = 0; i < n; ++i) {
    t[static_cast<size_t>(i)] = at;
    at += gap(rng);
  }
  return t;
}

std::vector<std::string> SseSplitter::feed(const char* data, size_t len) {
  buf_.append(data, len);
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t end = buf_.find("\n\n", start);
    if (end == std::string::npos) break;
    // One event: its `data:` lines joined by newlines (the server sends one).
    std::string payload;
    bool any = false;
    size_t p = start;
    while (p < end) {
      size_t nl = buf_.find('\n', p);
      if (nl == std::string::npos || nl > end) nl = end;
      std::string_view line(buf_.data() + p, nl - p);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.substr(0, 5) == "data:") {
        line.remove_prefix(5);
        if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
        if (any) payload += '\n';
        payload.append(line);
        any = true;
      }
      p = nl + 1;
    }
    if (any) out.push_back(std::move(payload));
    start = end + 2;
  }
  buf_.erase(0, start);
  return out;
}

bool is_chat_endpoint(const std::string& endpoint) {
  const std::string_view suffix = "/chat/completions";
  return endpoint.size() >= suffix.size() && endpoint.compare(endpoint.size() - suffix.size(), suffix.size(), suffix) == 0;
}

RequestOutcome send_completion(const BenchServeSettings& s, const std::vector<int>& prompt) {
  RequestOutcome o;
  o.prompt_len = static_cast<int>(prompt.size());
  const bool chat = is_chat_endpoint(s.endpoint);
  if (chat && !s.detokenize) {
    o.error = "a chat endpoint needs the prompts as text (no tokenizer given)";
    return o;
  }
  json body = {{"model", s.model},
               {"max_tokens", s.output_len},
               {"temperature", 0.0},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (chat)
    body["messages"] = json::array({{{"role", "user"}, {"content", s.detokenize(prompt)}}});
  else
    body["prompt"] = prompt;
  if (s.ignore_eos) body["ignore_eos"] = true;

  auto cli = make_client(s);
  httplib::Request req;
  req.method = "POST";
  req.path = s.endpoint;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");

  SseSplitter sse;
  int status = 0;
  std::string error_body;
  bool done = false;
  int chunks_with_text = 0;
  bool have_usage = false;
  bool first = true;
  Clock::time_point last;
  const Clock::time_point t0 = Clock::now();
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (status != 200) {
      if (error_body.size() < 4096) error_body.append(data, std::min<size_t>(len, 4096));
      return true;
    }
    const auto now = Clock::now();
    for (const std::string& payload : sse.feed(data, len)) {
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      json j = json::parse(payload, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) {
        o.error = "bad SSE chunk: " + payload.substr(0, 200);
        return false;
      }
      if (j.contains("error")) {
        o.error = "server error in stream: " + payload.substr(0, 300);
        continue;
      }
      if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
        const json& c = j["choices"][0];
        // Chat streams open with a {"role": "assistant"} delta that carries no
        // token: it is not the first token.
        const bool role_only = chat && c.contains("delta") && c["delta"].is_object() && c["delta"].contains("role") &&
                               c["delta"].value("content", std::string()).empty() &&
                               c.value("finish_reason", json()).is_null();
        if (role_only) continue;
        // As vLLM: the first chunk with choices is the first token; each later
        // one is an inter-token gap.
        if (first) {
          first = false;
          o.ttft = std::chrono::duration<double>(now - t0).count();
        } else {
          o.itl.push_back(std::chrono::duration<double>(now - last).count());
        }
        last = now;
        const json* text = c.contains("text") ? &c["text"]
                           : c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content")
                               ? &c["delta"]["content"]
                               : nullptr;
        if (text && text->is_string() && !text->get<std::string>().empty()) ++chunks_with_text;
        if (c.contains("finish_reason") && c["finish_reason"].is_string())
          o.finish_reason = c["finish_reason"].get<std::string>();
      } else if (j.contains("usage") && j["usage"].is_object() && j["usage"].contains("completion_tokens")) {
        o.output_tokens = j["usage"]["completion_tokens"].get<int>();
        // Chat: the prompt the server ran (the decoded text re-tokenized in the template).
        if (chat && j["usage"].contains("prompt_tokens") && j["usage"]["prompt_tokens"].is_number_integer())
          o.prompt_len = j["usage"]["prompt_tokens"].get<int>();
        have_usage = true;
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = cli.send(req, res, err);
  o.latency = seconds_since(t0);
  if (!ok && o.error.empty()) {
    o.error = fmt::format("request failed: {}", describe(err));
    return o;
  }
  if (status != 200) {
    o.error = fmt::format("HTTP {}: {}", status, error_body.substr(0, 500));
    return o;
  }
  if (!o.error.empty()) return o;
  if (!done) {
    o.error = "stream ended without [DONE]";
    return o;
  }
  if (!have_usage) o.output_tokens = chunks_with_text;
  o.success = true;
  return o;
}

std::string query_served_model(const BenchServeSettings& s) {
  auto cli = make_client(s);
  cli.set_read_timeout(30);
  auto r = cli.Get("/v1/models");
  if (!r) throw InputError(fmt::format("bench serve: cannot reach {}: {}", s.base_url, describe(r.error())));
  if (r->status != 200)
    throw InputError(fmt::format("bench serve: GET {}/v1/models answered {}: {}", s.base_url, r->status,
                                 r->body.substr(0, 300)));
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
    throw InputError(fmt::format("bench serve: GET {}/v1/models: no model id in {}", s.base_url, r->body.substr(0, 300)));
  return j["data"][0]["id"].get<std::string>();
}

BenchServeRun run_bench_serve(const BenchServeSettings& s) {
  if (s.num_prompts < 1) throw InputError("--num-prompts must be >= 1");
  if (s.input_len < 1 || s.output_len < 1) throw InputError("--random-input-len and --random-output-len must be >= 1");
  if (!(s.request_rate > 0)) throw InputError("--request-rate must be > 0 (inf: all at once)");
  const auto prompts = random_prompts(s.num_prompts, s.input_len, s.vocab_size, s.seed);

  // vLLM's initial test run: one request that must succeed.
  {
    const RequestOutcome t = send_completion(s, prompts[0]);
    if (!t.success)
      throw InputError(fmt::format("bench serve: the initial test request to {}{} failed: {}", s.base_url, s.endpoint,
                                   t.error));
  }
  for (int i = 0; i < s.num_warmups; ++i) (void)send_completion(s, prompts[static_cast<size_t>(i) % prompts.size()]);

  const auto at = arrival_times(s.num_prompts, s.request_rate, s.seed);
  BenchServeRun run;
  run.outcomes.resize(prompts.size());
  Gate gate(s.max_concurrency);
  std::vector<std::thread> threads;
  threads.reserve(prompts.size());
  std::mutex progress_mu;
  uint64_t finished = 0;
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at[i])));
    gate.acquire();
    threads.emplace_back([&, i] {
      run.outcomes[i] = send_completion(s, prompts[i]);
      gate.release();
      if (s.progress) {
        std::lock_guard<std::mutex> lock(progress_mu);
        s.progress(++finished, prompts.size());
      }
    });
  }
  for (auto& t : threads) t.join();
  run.duration_s = seconds_since(start);
  return run;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

namespace {
void add_stats(nlohmann::ordered_json& j, const std::string& name, const std::vector<double>& seconds) {
  double sum = 0.0;
  for (double x : seconds) sum += x;
  const double n = static_cast<double>(seconds.size());
  const double mean = seconds.empty() ? 0.0 : sum / n;
  double var = 0.0;
  for (double x : seconds) var += (x - mean) * (x - mean);
  const double sd = seconds.empty() ? 0.0 : std::sqrt(var / n);  // numpy.std (population)
  j["mean_" + name + "_ms"] = mean * 1e3;
  j["median_" + name + "_ms"] = percentile(seconds, 50) * 1e3;
  j["std_" + name + "_ms"] = sd * 1e3;
  j["p99_" + name + "_ms"] = percentile(seconds, 99) * 1e3;
}
}  // namespace

nlohmann::ordered_json summarize(const BenchServeRun& r, const BenchServeSettings& s) {
  int completed = 0;
  int64_t in_tokens = 0, out_tokens = 0;
  std::vector<double> ttft, tpot, itl, e2el;
  using ojson = nlohmann::ordered_json;
  ojson input_lens = ojson::array(), output_lens = ojson::array(), ttfts = ojson::array(),
        itls = ojson::array(), errors = ojson::array();
  for (const RequestOutcome& o : r.outcomes) {
    errors.push_back(o.error);
    if (!o.success) {
      input_lens.push_back(o.prompt_len);
      output_lens.push_back(0);
      ttfts.push_back(0.0);
      itls.push_back(nlohmann::ordered_json::array());
      continue;
    }
    ++completed;
    in_tokens += o.prompt_len;
    out_tokens += o.output_tokens;
    input_lens.push_back(o.prompt_len);
    output_lens.push_back(o.output_tokens);
    ttfts.push_back(o.ttft);
    itls.push_back(nlohmann::ordered_json(o.itl));
    ttft.push_back(o.ttft);
    e2el.push_back(o.latency);
    itl.insert(itl.end(), o.itl.begin(), o.itl.end());
    // vLLM: (latency - ttft) / (output tokens - 1), for outputs of > 1 token.
    if (o.output_tokens > 1) tpot.push_back((o.latency - o.ttft) / static_cast<double>(o.output_tokens - 1));
  }
  const double d = r.duration_s > 0 ? r.duration_s : 1e-9;
  nlohmann::ordered_json j;
  j["backend"] = is_chat_endpoint(s.endpoint) ? "openai-chat" : "openai";
  j["endpoint"] = s.endpoint;
  j["base_url"] = s.base_url;
  j["model_id"] = s.model;
  j["num_prompts"] = s.num_prompts;
  j["request_rate"] = std::isfinite(s.request_rate) ? nlohmann::ordered_json(s.request_rate) : nlohmann::ordered_json("inf");
  j["burstiness"] = 1.0;
  j["max_concurrency"] = s.max_concurrency > 0 ? nlohmann::ordered_json(s.max_concurrency) : nlohmann::ordered_json(nullptr);
  j["random_input_len"] = s.input_len;
  j["random_output_len"] = s.output_len;
  j["ignore_eos"] = s.ignore_eos;
  j["seed"] = s.seed;
  j["duration"] = r.duration_s;
  j["completed"] = completed;
  j["failed"] = static_cast<int>(r.outcomes.size()) - completed;
  j["total_input_tokens"] = in_tokens;
  j["total_output_tokens"] = out_tokens;
  j["request_throughput"] = completed / d;
  j["output_throughput"] = static_cast<double>(out_tokens) / d;
  j["total_token_throughput"] = static_cast<double>(in_tokens + out_tokens) / d;
  add_stats(j, "ttft", ttft);
  add_stats(j, "tpot", tpot);
  add_stats(j, "itl", itl);
  add_stats(j, "e2el", e2el);
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = std::move(output_lens);
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["errors"] = std::move(errors);
  return j;
}

}  // namespace fp8kv::server
