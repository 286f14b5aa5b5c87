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
//   (+ the linear-attention layers' states read and written, counted with
//   the KV bytes; bench/traffic.h); gbps = bytes_per_step / decode step time;
//   floor_fraction = (bytes_per_step / copy bandwidth) / decode step time.
// - A full-batch decode step (full_batch_* fields) is a decode step in which
//   every request of the round is still unfinished, i.e. the whole batch
//   decodes and no prefill runs (nor a preempted request's recompute). These
//   are the steady-state figures: with chunked prefill, early requests may
//   finish before the last prompt is prefilled, so the decode window above
//   can hold only a few sequences (docs/bench.md "Full-batch decode").
#pragma once
#include <cstdint>
#include <functional>
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
  // Called after each engine step of the timed rounds with (output tokens so
  // far, output tokens in all): the CLI's progress bar. Optional.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct BenchResult {
  double output_tokens_per_s = 0, total_tokens_per_s = 0, decode_tokens_per_s = 0;
  double decode_ms_per_step = 0, ttft_ms = 0;
  double bytes_per_step = 0, weight_bytes_per_step = 0, kv_bytes_per_step = 0;
  double gbps = 0, floor_fraction = 0, copy_gbps = 0;
  double elapsed_s = 0;            // timed iterations, summed
  int64_t prompt_tokens = 0, output_tokens = 0, decode_steps = 0, steps = 0;
  // Full-batch decode steps (every request of the round decoding, no
  // prefill): count, median ms, tokens generated in them over their summed
  // time, and the same bytes/floor figures over those steps only (0 when
  // there was none). full_batch_context: mean tokens attended per sequence.
  int64_t full_batch_decode_steps = 0;
  double full_batch_decode_ms_per_step = 0, full_batch_decode_tokens_per_s = 0;
  double full_batch_bytes_per_step = 0, full_batch_weight_bytes_per_step = 0, full_batch_kv_bytes_per_step = 0;
  double full_batch_gbps = 0, full_batch_floor_fraction = 0, full_batch_context = 0;
  // CUDA graphs during the timed iterations: decode steps replayed, and
  // graphs captured (0 since the engine captures every bucket at load; a
  // capture is an eager step plus instantiation inside the timed region).
  int64_t graph_replays = 0, graph_captures = 0;
};

// How run_bench counts a step, from the round's state before it ran:
// round_size requests submitted, `unfinished` of them not finished,
// `awaiting_first` of those without their first token yet, and whether the
// engine preempted a request during the step (its recompute is a prefill).
struct StepClass {
  bool decode = false;      // decode step: no unfinished request awaits its first token
  bool full_batch = false;  // and every request of the round decodes, no preemption
};
StepClass classify_step(int round_size, int unfinished, int awaiting_first, bool preempted);

// Runs the benchmark on `engine`. copy_bytes_per_s: the copy bandwidth
// measured in this run (bench/copy_bandwidth.h, or the CUDA one). Throws
// InputError on impossible settings (e.g. input + output > max_model_len) and
// std::runtime_error when no decode step was measured.
BenchResult run_bench(Engine& engine, const BenchSettings& s, double copy_bytes_per_s);

// The JSON result: the fields listed in docs/bench.md + settings.
nlohmann::json to_json(const BenchResult& r, const BenchSettings& s);

}  // namespace fp8kv::bench
