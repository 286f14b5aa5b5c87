// `fp8kv bench latency|throughput MODEL_OR_CONFIG_DIR`: decode and prefill
// speed through the public Engine API, with vLLM's flag names, and the
// achieved bandwidth as a fraction of the copy bandwidth measured in the same
// run (docs/bench.md; docs/design.md "Performance method").
//
// Engine flags come from EngineFlags (engine_flags.h): --kv-cache-dtype,
// --max-model-len, --block-size, --kv-memory, --backend, --threads, and, where
// that header provides them, --load-format dummy (random weights from
// config.json alone), --max-num-seqs, --max-num-batched-tokens.
// `bench serve` may be added by another file: each registers its own
// subcommand under the shared "bench" parent (bench_parent below).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/backend.h"  // resolve_backend
#include "bench/copy_bandwidth.h"
#include "bench/runner.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/progress.h"
#include "engine/engine.h"
#include "io/errors.h"
#include "io/host_memory.h"
#include "kv/planner.h"
#include "model/config.h"
#include "numerics/version.h"
#ifdef FP8KV_HAVE_CUDA
#include "backend/cuda/copy_bandwidth.h"
#endif

namespace fp8kv::cli {
namespace {

struct BenchArgs {
  std::string model;
  bench::BenchSettings s;
  bool json = false;
  EngineFlags engine;
};

// Refuses, before the model loads, a request count whose token ids alone
// cannot fit in memory (each request keeps its prompt, and its sequence the
// prompt and the output: (2 x input + output) x 4 bytes at least).
void check_request_memory(const bench::BenchSettings& s, const std::string& mode) {
  const bool latency = mode == "latency";
  const int64_t n = latency ? s.batch_size : s.num_prompts;
  const double bytes = static_cast<double>(n) * (2.0 * s.input_len + s.output_len) * 4.0;
  const uint64_t mem = host_physical_memory();
  if (mem > 0 && bytes > static_cast<double>(mem))
    throw InputError(fmt::format("{} {}: {} requests x (2 x --input-len {} + --output-len {}) tokens x 4 bytes = "
                                 "{:.1f} GiB of token ids alone, more than this machine's {:.1f} GiB of memory; "
                                 "lower {}",
                                 latency ? "--batch-size" : "--num-prompts", n, n, s.input_len, s.output_len,
                                 bytes / (1 << 30), static_cast<double>(mem) / (1 << 30),
                                 latency ? "--batch-size" : "--num-prompts"));
}

int run_bench(BenchArgs a, const std::string& mode) {
  a.s.mode = mode;
  EngineOptions o = a.engine.options();
  // Without --max-model-len the engine is sized for the run's requests
  // (input + output tokens), which must fit the model's limit; a refusal
  // names that limit and where it came from, never a --max-model-len the
  // user did not give (issue 37).
  const int64_t run_len = static_cast<int64_t>(a.s.input_len) + a.s.output_len;
  if (o.max_model_len == 0) {
    const ModelConfig cfg = load_model_config(a.model);
    const int limit = model_max_len(cfg);
    if (limit > 0 && run_len > limit)
      throw InputError(fmt::format("--input-len {} + --output-len {} = {} tokens exceed max_model_len {} ({}); "
                                   "lower --input-len or --output-len",
                                   a.s.input_len, a.s.output_len, run_len, limit,
                                   max_model_len_origin(cfg, KvPlanSettings{})));
    o.max_model_len = static_cast<int>(run_len);
  } else if (run_len > o.max_model_len) {
    throw InputError(fmt::format("--input-len {} + --output-len {} = {} tokens exceed max_model_len {} (--max-model-len)",
                                 a.s.input_len, a.s.output_len, run_len, o.max_model_len));
  }
  check_request_memory(a.s, mode);
  if (mode == "latency") o.max_num_seqs = std::max(o.max_num_seqs, a.s.batch_size);
  // cuda when the engine runs on the GPU (--backend cuda, or auto with the
  // CUDA backend built and a device present), else cpu.
  const BackendKind backend = resolve_backend(o.backend);
  auto engine = Engine::load(a.model, o);
  if (!engine) return 0;  // a multi-process follower: rank 0 did the work (Engine::load)

  double copy = 0.0;
  if (backend == BackendKind::cuda) {
#ifdef FP8KV_HAVE_CUDA
    copy = cuda::d2d_copy_bytes_per_s();
#endif
  } else {
    copy = bench::host_copy_bytes_per_s();
  }
  Progress progress(fmt::format("bench {}", mode), "output tokens");
  a.s.progress = std::ref(progress);
  const bench::BenchResult r = bench::run_bench(*engine, a.s, copy);
  nlohmann::json j = bench::to_json(r, a.s);
  j["model"] = a.model;
  j["backend"] = std::string(backend_kind_name(backend));
  j["kv_cache_dtype"] = std::string(kv_dtype_name(engine->kv_dtype()));
  // Linear-attention models: the state dtypes the decode step streams (null for other models).
  const StatePlan& sp = engine->kv_plan().state;
  auto state_dtype = [&](StateDtype d) {
    return sp.empty() ? nlohmann::json(nullptr) : nlohmann::json(std::string(state_dtype_name(d)));
  };
  j["state_conv_dtype"] = state_dtype(sp.conv_dtype);
  j["state_ssm_dtype"] = state_dtype(sp.ssm_dtype);
  j["max_model_len"] = engine->max_model_len();
  j["max_num_seqs"] = o.max_num_seqs;
  j["max_num_batched_tokens"] = o.max_num_batched_tokens;
  j["block_size"] = o.block_size;
  j["threads"] = o.num_threads;
  j["fp8kv_version"] = version_string();
  if (a.json) {
    std::printf("%s\n", dump_json(j).c_str());
  } else {
    std::printf("bench %s: %s, backend %s, kv %s, input %d, output %d, %s %d\n", mode.c_str(), a.model.c_str(),
                j["backend"].get<std::string>().c_str(), j["kv_cache_dtype"].get<std::string>().c_str(),
                a.s.input_len, a.s.output_len, mode == "latency" ? "batch" : "prompts",
                mode == "latency" ? a.s.batch_size : a.s.num_prompts);
    std::printf("output tok/s        %12.2f\n", r.output_tokens_per_s);
    std::printf("total tok/s         %12.2f\n", r.total_tokens_per_s);
    std::printf("decode tok/s        %12.2f\n", r.decode_tokens_per_s);
    std::printf("decode ms/step      %12.3f  (median of %lld decode steps)\n", r.decode_ms_per_step,
                static_cast<long long>(r.decode_steps));
    std::printf("TTFT ms             %12.3f  (median)\n", r.ttft_ms);
    std::printf("bytes/step          %12.4g  (weights %.4g + KV %.4g)\n", r.bytes_per_step, r.weight_bytes_per_step,
                r.kv_bytes_per_step);
    std::printf("GB/s                %12.2f  (copy bandwidth %.2f GB/s)\n", r.gbps, r.copy_gbps);
    std::printf("floor fraction      %12.3f\n", r.floor_fraction);
    // Steady state: every request of the batch decoding, no prefill (docs/bench.md).
    std::printf("full-batch decode   %12lld  steps (every request decoding, no prefill)\n",
                static_cast<long long>(r.full_batch_decode_steps));
    if (r.full_batch_decode_steps > 0) {
      std::printf("  tok/s             %12.2f\n", r.full_batch_decode_tokens_per_s);
      std::printf("  ms/step           %12.3f  (median)\n", r.full_batch_decode_ms_per_step);
      std::printf("  bytes/step        %12.4g  (weights %.4g + KV %.4g; mean context %.0f)\n",
                  r.full_batch_bytes_per_step, r.full_batch_weight_bytes_per_step, r.full_batch_kv_bytes_per_step,
                  r.full_batch_context);
      std::printf("  GB/s              %12.2f  (floor fraction %.3f)\n", r.full_batch_gbps, r.full_batch_floor_fraction);
    }
  }
  return 0;
}

void add_common(CLI::App* sub, BenchArgs* a) {
  sub->add_option("MODEL_OR_CONFIG_DIR", a->model, "Checkpoint directory (config-only with --load-format dummy)")
      ->required();
  sub->add_option("--input-len", a->s.input_len, "Prompt tokens per request (random ids)")->check(at_least(1));
  sub->add_option("--output-len", a->s.output_len, "Generated tokens per request (>= 2)")->check(at_least(2));
  sub->add_flag("--ignore-eos", a->s.ignore_eos, "Generate --output-len tokens even past EOS");
  sub->add_option("--seed", a->s.seed, "Seed of the random prompts (default 0; -1: random, logged)")->transform(seed_rule());
  sub->add_flag("--json", a->json, "Print the result as JSON");
  a->engine.add(sub);
}

Registrar reg_bench([](CLI::App& app) {
  static BenchArgs lat, thr;  // live for the program
  CLI::App* parent = bench_parent(app);
  auto* l = parent->add_subcommand("latency", "Latency of one batch: TTFT, ms per decode step, tok/s, bandwidth");
  add_common(l, &lat);
  l->add_option("--batch-size", lat.s.batch_size, "Requests run together")->check(at_least(1));
  l->add_option("--num-iters-warmup", lat.s.num_iters_warmup, "Untimed iterations first")
      ->check(at_least(0));
  l->add_option("--num-iters", lat.s.num_iters, "Timed iterations")->check(at_least(1));
  set_action(l, [] { return run_bench(lat, "latency"); });

  auto* t = parent->add_subcommand("throughput", "Throughput of --num-prompts requests submitted at once");
  add_common(t, &thr);
  thr.s.num_iters_warmup = 1;
  t->add_option("--num-prompts", thr.s.num_prompts, "Requests in all")->check(at_least(1));
  t->add_option("--num-iters-warmup", thr.s.num_iters_warmup, "0: no warm-up round; >= 1: one short round")
      ->check(at_least(0));
  set_action(t, [] { return run_bench(thr, "throughput"); });
});

}  // namespace
}  // namespace fp8kv::cli
