#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace fp8kv::server {

void Histogram::observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();  // le: v <= bound
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, bounds_[i], cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, cum);
  out += fmt::format("{}_sum{{{}}} {}\n", name, labels, sum_);
  out += fmt::format("{}_count{{{}}} {}\n", name, labels, count_);
}

namespace {
// vLLM's bucket bounds for these three histograms.
std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
          160.0, 640.0, 2560.0};
}
std::vector<double> itl_buckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> e2e_buckets() {
  return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
          1920.0, 7680.0};
}
std::string escape_label(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}
}  // namespace

Metrics::Metrics(std::string model_name)
    : labels_(fmt::format("model_name=\"{}\"", escape_label(model_name))),
      ttft_(ttft_buckets()),
      itl_(itl_buckets()),
      e2e_(e2e_buckets()) {}

void Metrics::set_gauges(const Gauges& g) {
  std::lock_guard l(m_);
  g_ = g;
}
void Metrics::add_prompt_tokens(int n) {
  std::lock_guard l(m_);
  prompt_tokens_ += static_cast<uint64_t>(n);
}
void Metrics::add_generation_tokens(int n) {
  std::lock_guard l(m_);
  generation_tokens_ += static_cast<uint64_t>(n);
}
void Metrics::observe_ttft(double s) {
  std::lock_guard l(m_);
  ttft_.observe(s);
}
void Metrics::observe_itl(double s) {
  std::lock_guard l(m_);
  itl_.observe(s);
}
void Metrics::observe_e2e(double s, const std::string& finish_reason) {
  std::lock_guard l(m_);
  e2e_.observe(s);
  ++finished_[finish_reason];
}
Gauges Metrics::gauges() const {
  std::lock_guard l(m_);
  return g_;
}

std::string Metrics::render() const {
  std::lock_guard l(m_);
  std::string o;
  auto head = [&](const char* name, const char* type, const char* help) {
    o += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  auto line = [&](const char* name, auto v) { o += fmt::format("{}{{{}}} {}\n", name, labels_, v); };
  head("fp8kv:num_requests_running", "gauge", "Requests in the engine's running batch.");
  line("fp8kv:num_requests_running", g_.running);
  head("fp8kv:num_requests_waiting", "gauge", "Requests waiting to be admitted.");
  line("fp8kv:num_requests_waiting", g_.waiting);
  head("fp8kv:kv_cache_usage_perc", "gauge", "KV cache usage: 1 = all blocks in use.");
  line("fp8kv:kv_cache_usage_perc",
       g_.total_blocks > 0 ? 1.0 - static_cast<double>(g_.free_blocks) / static_cast<double>(g_.total_blocks) : 0.0);
  head("fp8kv:kv_cache_free_blocks", "gauge", "Free blocks in the KV pool.");
  line("fp8kv:kv_cache_free_blocks", g_.free_blocks);
  head("fp8kv:kv_cache_total_blocks", "gauge", "Blocks in the KV pool.");
  line("fp8kv:kv_cache_total_blocks", g_.total_blocks);
  head("fp8kv:prompt_tokens_total", "counter", "Prefill tokens processed.");
  line("fp8kv:prompt_tokens_total", prompt_tokens_);
  head("fp8kv:generation_tokens_total", "counter", "Generation tokens produced.");
  line("fp8kv:generation_tokens_total", generation_tokens_);
  head("fp8kv:num_preemptions_total", "counter",
       "Preemptions by recompute: the KV pool was full and the newest running request gave its blocks back.");
  line("fp8kv:num_preemptions_total", g_.num_preemptions);
  head("fp8kv:prefix_cache_queries_total", "counter",
       "Prefix cache queries, in tokens: prompt tokens looked up at admission (again after a preemption).");
  line("fp8kv:prefix_cache_queries_total", g_.prefix_cache_queries);
  head("fp8kv:prefix_cache_hits_total", "counter",
       "Prefix cache hits, in tokens: queried tokens whose KV was reused instead of prefilled.");
  line("fp8kv:prefix_cache_hits_total", g_.prefix_cache_hits);
  if (g_.kv_clipped) {
    head("fp8kv:kv_cache_clipped_total", "counter",
         "KV elements stored as the fp8 format's max because |x / scale| was beyond it, by layer and stream (k, v); "
         "always 0 for bf16 and per-token-head caches.");
    for (const Gauges::LayerClips& c : *g_.kv_clipped)
      for (const auto& [stream, n] : {std::pair{"k", c.k}, std::pair{"v", c.v}})
        o += fmt::format("fp8kv:kv_cache_clipped_total{{{},layer=\"{}\",stream=\"{}\"}} {}\n", labels_, c.layer,
                         stream, n);
  }
  head("fp8kv:request_success_total", "counter", "Finished requests by finish reason.");
  for (const auto& [reason, n] : finished_)
    o += fmt::format("fp8kv:request_success_total{{{},finished_reason=\"{}\"}} {}\n", labels_, reason, n);
  head("fp8kv:time_to_first_token_seconds", "histogram", "Time to first token (from arrival).");
  ttft_.render(o, "fp8kv:time_to_first_token_seconds", labels_);
  head("fp8kv:inter_token_latency_seconds", "histogram", "Time between consecutive tokens of a request.");
  itl_.render(o, "fp8kv:inter_token_latency_seconds", labels_);
  head("fp8kv:e2e_request_latency_seconds", "histogram", "Arrival to last token.");
  e2e_.render(o, "fp8kv:e2e_request_latency_seconds", labels_);
  return o;
}

}  // namespace fp8kv::server
