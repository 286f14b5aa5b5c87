// `fp8kv bench latency|throughput` through the public Engine API
// (submit/step), timing every step. Definitions (docs/bench.md):
// - TTFT: from submission to the step that returns a request's first token,
//   median over requests (and iterations).
// - A decode step is a step in which every unfinished request already had its
//   first token (no prefill in it); decode_ms_per_step is the median of those.
// - decode_tokens_per_s: tokens generated after every request of a round had
//   its first token, over the time from then to the end of the round (batch
//   1: generated tokens over the time after the first token, issue 12 §3).
// - output/total_tokens_per_s: generated (+ prompt) tokens over wall time.
// - bytes_per_step: mean over decode steps of weights streamed + KV read
//   (bench/traffic.h); gbps = bytes_per_step / decode step time;
//   floor_fraction = (bytes_per_step / copy bandwidth) / decode step time.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace fp8kv::bench {

struct BenchSettings {
  std::string mode = "latency";  // latency | throughput
  int input_len = 32;
  int output_len = 128;
  int batch_size = 8;     // latency: requests per iteration
  int num_prompts = 64;   // throughput: requests in all
  int num_iters_warmup = 1;
  int num_iters = 3;
  bool ignore_eos = false;
  uint64_t seed = 0;
  int weight_elem_bytes = 2;  // bf16 weights: the floor's bytes per parameter
};

struct BenchResult {
  double output_tokens_per_s = 0, total_tokens_per_s = 0, decode_tokens_per_s = 0;
  double decode_ms_per_step = 0, ttft_ms = 0;
  double bytes_per_step = 0, weight_bytes_per_step = 0, kv_bytes_per_step = 0;
  double gbps = 0, floor_fraction = 0, copy_gbps = 0;
  double elapsed_s = 0;            // timed iterations, summed
  int64_t prompt_tokens = 0, output_tokens = 0, decode_steps = 0, steps = 0;
};

// Runs the benchmark on `engine`. copy_bytes_per_s: the copy bandwidth
// measured in this run (bench/copy_bandwidth.h, or the CUDA one). Throws
// InputError on impossible settings (e.g. input + output > max_model_len) and
// std::runtime_error when no decode step was measured.
BenchResult run_bench(Engine& engine, const BenchSettings& s, double copy_bytes_per_s);

// The JSON result: the fields listed in docs/bench.md + settings.
nlohmann::json to_json(const BenchResult& r, const BenchSettings& s);

}  // namespace fp8kv::bench
