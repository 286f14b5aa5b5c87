// Prometheus metrics with vLLM's names under the fp8kv: prefix
// (docs/design.md "Command line"; docs/server.md lists them). Written by the
// engine loop thread, read by /metrics; one mutex guards all of it.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace fp8kv::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Appends the _bucket/_sum/_count lines.
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

struct Gauges {
  int running = 0;
  int waiting = 0;
  int64_t free_blocks = 0;
  int64_t total_blocks = 0;
  // The engine's own counters (monotonic), copied at each step.
  int64_t num_preemptions = 0;
  int64_t prefix_cache_queries = 0;  // tokens
  int64_t prefix_cache_hits = 0;     // tokens
  // KV elements that saturated at store, per KV-cache layer (Engine::
  // kv_clip_counts); nullopt: the backend does not count (the metric is
  // then absent).
  struct LayerClips {
    int layer = 0;
    uint64_t k = 0, v = 0;
  };
  std::optional<std::vector<LayerClips>> kv_clipped;
};

class Metrics {
 public:
  explicit Metrics(std::string model_name);
  void set_gauges(const Gauges& g);
  void add_prompt_tokens(int n);
  void add_generation_tokens(int n);
  void observe_ttft(double s);
  void observe_itl(double s);
  void observe_e2e(double s, const std::string& finish_reason);
  Gauges gauges() const;
  std::string render() const;

 private:
  mutable std::mutex m_;
  std::string labels_;
  Gauges g_;
  uint64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  std::map<std::string, uint64_t> finished_;  // by finish reason
  Histogram ttft_, itl_, e2e_;
};

}  // namespace fp8kv::server
