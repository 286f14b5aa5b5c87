#include "bench/runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

#include "bench/traffic.h"
#include "engine/tp_shard.h"
#include "io/errors.h"

namespace fp8kv::bench {
namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Tally {
  std::vector<double> ttft_s, decode_step_s, full_step_s;
  double decode_bytes_sum = 0, decode_weight_sum = 0, decode_kv_sum = 0;
  double full_bytes_sum = 0, full_weight_sum = 0, full_kv_sum = 0, full_context_sum = 0;
  int64_t full_tokens = 0;
  double elapsed_s = 0, after_first_s = 0;
  int64_t prompt_tokens = 0, output_tokens = 0, after_first_tokens = 0, steps = 0;
};

struct Live {
  Clock::time_point submitted;
  int context = 0;  // tokens in the cache after the last step (prompt + generated)
  int generated = 0;
  bool first = false;
  bool done = false;
};

// One round: submit n requests at once, step until idle.
// total_tokens: output tokens of all timed rounds, for s.progress (0: a
// warm-up round, not reported).
void run_round(Engine& e, const BenchSettings& s, int n, std::mt19937_64& rng, Tally* t, uint64_t total_tokens) {
  // Per rank under tensor parallelism (the ranks stream in parallel): engine/tp_shard.h.
  const ModelConfig c = rank_traffic_config(e.config(), e.kv_plan().tensor_parallel_size);
  std::map<RequestId, Live> live;
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    Request r;
    r.prompt.resize(s.input_len);
    for (auto& x : r.prompt) x = static_cast<int>(rng() % static_cast<uint64_t>(c.vocab_size));
    r.options.max_tokens = s.output_len;
    r.options.stop_at_eos = !s.ignore_eos;
    Live l;
    l.submitted = Clock::now();
    l.context = s.input_len;
    live.emplace(e.submit(std::move(r)), l);
  }
  Clock::time_point all_first{};
  bool have_all_first = false;
  int64_t tokens_after_all_first = 0;
  std::vector<int> contexts;
  while (!e.idle()) {
    int awaiting_first = 0;
    contexts.clear();
    for (const auto& [id, l] : live) {
      if (l.done) continue;
      if (!l.first) ++awaiting_first;
      contexts.push_back(l.context + 1);  // attends over the cache plus the new token
    }
    const int64_t preemptions = e.num_preemptions();
    const auto a = Clock::now();
    const std::vector<StepEvent> ev = e.step();
    const auto b = Clock::now();
    ++t->steps;
    const StepClass k =
        classify_step(n, static_cast<int>(contexts.size()), awaiting_first, e.num_preemptions() != preemptions);
    if (k.decode) {
      t->decode_step_s.push_back(seconds(a, b));
      const double w = static_cast<double>(decode_weight_bytes(c, static_cast<int>(contexts.size()), s.weight_elem_bytes));
      const StatePlan& sp = e.kv_plan().state;  // its dtypes (empty without linear-attention layers)
      const double kv = static_cast<double>(
          decode_kv_bytes(c, e.kv_dtype(), contexts) +
          decode_state_bytes(c, static_cast<int>(contexts.size()), sp.conv_dtype, sp.ssm_dtype));
      t->decode_weight_sum += w;
      t->decode_kv_sum += kv;
      t->decode_bytes_sum += w + kv;
      if (k.full_batch) {
        t->full_step_s.push_back(seconds(a, b));
        t->full_weight_sum += w;
        t->full_kv_sum += kv;
        t->full_bytes_sum += w + kv;
        for (int x : contexts) t->full_context_sum += x;
        t->full_tokens += static_cast<int64_t>(contexts.size());
      }
    }
    for (const StepEvent& x : ev) {
      auto it = live.find(x.id);
      if (it == live.end()) throw std::runtime_error(fmt::format("bench: step returned unknown request {}", x.id));
      Live& l = it->second;
      if (x.token >= 0) {
        if (!l.first) {
          l.first = true;
          t->ttft_s.push_back(seconds(l.submitted, b));
          l.context = s.input_len;  // prefill done; the first token is not in the cache yet
        } else {
          ++l.context;
          if (have_all_first) ++tokens_after_all_first;
        }
        ++l.generated;
        ++t->output_tokens;
      }
      if (x.finished) l.done = true;
    }
    if (s.progress && total_tokens > 0) s.progress(static_cast<uint64_t>(t->output_tokens), total_tokens);
    if (!have_all_first && std::all_of(live.begin(), live.end(), [](const auto& p) { return p.second.first; })) {
      have_all_first = true;
      all_first = b;
    }
  }
  const auto t1 = Clock::now();
  t->elapsed_s += seconds(t0, t1);
  t->prompt_tokens += static_cast<int64_t>(n) * s.input_len;
  if (have_all_first) {
    t->after_first_s += seconds(all_first, t1);
    t->after_first_tokens += tokens_after_all_first;
  }
}

}  // namespace

StepClass classify_step(int round_size, int unfinished, int awaiting_first, bool preempted) {
  StepClass k;
  k.decode = unfinished > 0 && awaiting_first == 0;
  k.full_batch = k.decode && unfinished == round_size && !preempted;
  return k;
}

BenchResult run_bench(Engine& e, const BenchSettings& s, double copy_bytes_per_s) {
  if (s.mode != "latency" && s.mode != "throughput") throw InputError("bench: mode must be latency or throughput");
  if (s.input_len < 1) throw InputError("--input-len must be >= 1");
  if (s.output_len < 2) throw InputError("--output-len must be >= 2 (one decode step at least)");
  if (s.input_len + s.output_len > e.max_model_len())
    throw InputError(fmt::format("--input-len {} + --output-len {} exceeds max_model_len {}", s.input_len,
                                 s.output_len, e.max_model_len()));
  if (s.batch_size < 1 || s.num_prompts < 1 || s.num_iters < 1 || s.num_iters_warmup < 0)
    throw InputError("--batch-size, --num-prompts and --num-iters must be >= 1, --num-iters-warmup >= 0");
  if (!(copy_bytes_per_s > 0) || !std::isfinite(copy_bytes_per_s))
    throw std::runtime_error("bench: the copy bandwidth measurement failed");
  std::mt19937_64 rng(s.seed);
  const bool latency = s.mode == "latency";
  const int n = latency ? s.batch_size : s.num_prompts;
  const int iters = latency ? s.num_iters : 1;
  const int warm = latency ? s.num_iters_warmup : std::min(s.num_iters_warmup, 1);
  for (int i = 0; i < warm; ++i) {
    Tally scratch;
    // Throughput warms up on a small round (vLLM warms up nothing; one short
    // round keeps first-touch page faults out of the timed run).
    run_round(e, s, latency ? n : std::min(n, 4), rng, &scratch, 0);
  }
  Tally t;
  const int64_t replays0 = e.graph_replays(), captures0 = e.graph_captures();
  const uint64_t total = static_cast<uint64_t>(iters) * static_cast<uint64_t>(n) * static_cast<uint64_t>(s.output_len);
  for (int i = 0; i < iters; ++i) run_round(e, s, n, rng, &t, total);
  if (s.progress) s.progress(static_cast<uint64_t>(t.output_tokens), static_cast<uint64_t>(t.output_tokens));  // the final line
  if (t.decode_step_s.empty()) throw std::runtime_error("bench: no decode step was measured");

  BenchResult r;
  r.elapsed_s = t.elapsed_s;
  r.prompt_tokens = t.prompt_tokens;
  r.output_tokens = t.output_tokens;
  r.steps = t.steps;
  r.graph_replays = e.graph_replays() - replays0;
  r.graph_captures = e.graph_captures() - captures0;
  r.decode_steps = static_cast<int64_t>(t.decode_step_s.size());
  r.output_tokens_per_s = t.output_tokens / t.elapsed_s;
  r.total_tokens_per_s = (t.output_tokens + t.prompt_tokens) / t.elapsed_s;
  r.decode_tokens_per_s = t.after_first_s > 0 ? t.after_first_tokens / t.after_first_s : 0.0;
  const double step_s = median(t.decode_step_s);
  r.decode_ms_per_step = 1e3 * step_s;
  r.ttft_ms = 1e3 * median(t.ttft_s);
  const double steps = static_cast<double>(r.decode_steps);
  r.bytes_per_step = t.decode_bytes_sum / steps;
  r.weight_bytes_per_step = t.decode_weight_sum / steps;
  r.kv_bytes_per_step = t.decode_kv_sum / steps;
  r.gbps = r.bytes_per_step / step_s / 1e9;
  r.copy_gbps = copy_bytes_per_s / 1e9;
  r.floor_fraction = (r.bytes_per_step / copy_bytes_per_s) / step_s;
  if (!t.full_step_s.empty()) {
    const double fs = static_cast<double>(t.full_step_s.size());
    double sum_s = 0;
    for (double x : t.full_step_s) sum_s += x;
    const double full_step = median(t.full_step_s);
    r.full_batch_decode_steps = static_cast<int64_t>(t.full_step_s.size());
    r.full_batch_decode_ms_per_step = 1e3 * full_step;
    r.full_batch_decode_tokens_per_s = t.full_tokens / sum_s;
    r.full_batch_bytes_per_step = t.full_bytes_sum / fs;
    r.full_batch_weight_bytes_per_step = t.full_weight_sum / fs;
    r.full_batch_kv_bytes_per_step = t.full_kv_sum / fs;
    r.full_batch_gbps = r.full_batch_bytes_per_step / full_step / 1e9;
    r.full_batch_floor_fraction = (r.full_batch_bytes_per_step / copy_bytes_per_s) / full_step;
    r.full_batch_context = t.full_context_sum / static_cast<double>(t.full_tokens);
  }
  for (double v : {r.output_tokens_per_s, r.total_tokens_per_s, r.decode_tokens_per_s, r.decode_ms_per_step,
                   r.ttft_ms, r.bytes_per_step, r.gbps, r.floor_fraction, r.full_batch_decode_ms_per_step,
                   r.full_batch_decode_tokens_per_s, r.full_batch_bytes_per_step, r.full_batch_gbps,
                   r.full_batch_floor_fraction})
    if (!std::isfinite(v) || v < 0) throw std::runtime_error("bench: a measured figure is not finite");
  return r;
}

nlohmann::json to_json(const BenchResult& r, const BenchSettings& s) {
  nlohmann::json j;
  j["output_tokens_per_s"] = r.output_tokens_per_s;
  j["total_tokens_per_s"] = r.total_tokens_per_s;
  j["decode_tokens_per_s"] = r.decode_tokens_per_s;
  j["decode_ms_per_step"] = r.decode_ms_per_step;
  j["ttft_ms"] = r.ttft_ms;
  j["bytes_per_step"] = r.bytes_per_step;
  j["weight_bytes_per_step"] = r.weight_bytes_per_step;
  j["kv_bytes_per_step"] = r.kv_bytes_per_step;
  j["gbps"] = r.gbps;
  j["copy_gbps"] = r.copy_gbps;
  j["floor_fraction"] = r.floor_fraction;
  j["elapsed_s"] = r.elapsed_s;
  j["prompt_tokens"] = r.prompt_tokens;
  j["output_tokens"] = r.output_tokens;
  j["steps"] = r.steps;
  j["decode_steps"] = r.decode_steps;
  j["graph_replays"] = r.graph_replays;
  j["graph_captures"] = r.graph_captures;
  j["full_batch_decode_steps"] = r.full_batch_decode_steps;
  j["full_batch_decode_ms_per_step"] = r.full_batch_decode_ms_per_step;
  j["full_batch_decode_tokens_per_s"] = r.full_batch_decode_tokens_per_s;
  j["full_batch_bytes_per_step"] = r.full_batch_bytes_per_step;
  j["full_batch_weight_bytes_per_step"] = r.full_batch_weight_bytes_per_step;
  j["full_batch_kv_bytes_per_step"] = r.full_batch_kv_bytes_per_step;
  j["full_batch_gbps"] = r.full_batch_gbps;
  j["full_batch_floor_fraction"] = r.full_batch_floor_fraction;
  j["full_batch_context"] = r.full_batch_context;
  j["mode"] = s.mode;
  j["input_len"] = s.input_len;
  j["output_len"] = s.output_len;
  if (s.mode == "latency") {
    j["batch_size"] = s.batch_size;
    j["num_iters_warmup"] = s.num_iters_warmup;
    j["num_iters"] = s.num_iters;
  } else {
    j["num_prompts"] = s.num_prompts;
  }
  j["ignore_eos"] = s.ignore_eos;
  j["seed"] = s.seed;
  // The bytes per parameter of the weights not stored in fp8 (all of them for
  // a bf16 checkpoint; embedding, LM head and norms for an FP8-weight one,
  // whose projections the floor counts at 1 byte plus their scales:
  // weight_bytes_per_step).
  j["unquantized_weight_bytes_per_param"] = s.weight_elem_bytes;
  return j;
}

}  // namespace fp8kv::bench
