// The engine flags, parsed in ONE place for every command that runs the
// engine (generate, score, eval compare|kvstats|niah, calibrate), with vLLM's
// names and defaults (docs/design.md "Command line", docs/engine.md):
//   --kv-cache-dtype --max-model-len --block-size --kv-memory
//   --gpu-memory-utilization --max-num-seqs --max-num-batched-tokens
//   --backend --threads --load-format --enforce-eager --tokenizer
//   --fp8-weight-mode (fp8-weight checkpoints: w8a16 | w8a8)
//   --tensor-parallel-size --nnodes --node-rank --master-addr --master-port
//   --collective-timeout
//   --enable-prefix-caching / --no-enable-prefix-caching (default on)
//   --state-snapshot-interval (linear-attention models with prefix caching)
//   --mamba-cache-dtype --mamba-ssm-cache-dtype (linear-attention models)
// The same flag means the same everywhere: values are checked here (exit 2
// with "--flag must be ..." messages), --threads above the hardware threads
// is capped with a warning. Header-only so any cmd_*.cpp can use it.
#pragma once
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "backend/cpu/thread_pool.h"  // available_cpus
#include "cli/commands.h"  // UsageError
#include "engine/engine.h"
#include "io/errors.h"
#include "kv/planner.h"

namespace fp8kv::cli {

// --kv-cache-dtype, parsed once for every command (engine flags, capacity,
// eval kvstats): the names of numerics/fp8.h kv_cache_dtype_names() (vLLM's
// plus aliases). UsageError (exit 2) naming the flag and the accepted names.
inline KvCacheDtypeSetting parse_kv_cache_dtype_flag(const std::string& text, const char* flag = "--kv-cache-dtype") {
  try {
    KvCacheDtypeSetting s;
    s.dtype = parse_kv_cache_dtype(text);
    return s;
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("{}: {}", flag, e.what()));
  }
}
// The same names without auto (a concrete dtype: --target).
inline KvDtype parse_kv_dtype_flag(const std::string& text, const char* flag) {
  const KvCacheDtypeSetting s = parse_kv_cache_dtype_flag(text, flag);
  if (!s.dtype) throw UsageError(fmt::format("{}: give a dtype, not auto", flag));
  return *s.dtype;
}
inline std::string kv_cache_dtype_help() {
  return "KV cache dtype: " + kv_cache_dtype_choices() + "; fp8 = fp8_e4m3 (default auto)";
}

// --backend and --load-format, parsed once into their enums (code below the
// CLI never compares option strings). UsageError (exit 2) naming the flag.
inline BackendChoice parse_backend_flag(const std::string& text) {
  if (text == "auto") return BackendChoice::auto_;
  if (text == "cpu") return BackendChoice::cpu;
  if (text == "cuda") return BackendChoice::cuda;
  throw UsageError(fmt::format("--backend must be auto, cpu or cuda (got '{}')", text));
}
inline LoadFormat parse_load_format_flag(const std::string& text) {
  if (text == "auto") return LoadFormat::auto_;
  if (text == "dummy") return LoadFormat::dummy;
  throw UsageError(fmt::format("--load-format must be auto or dummy (got '{}')", text));
}

// --mamba-cache-dtype (the conv state) and --mamba-ssm-cache-dtype (the
// recurrent state) of linear-attention models, vLLM's names, parsed once into
// StateDtype (kv/state_plan.h). Values: auto, bfloat16, float32. As in vLLM,
// --mamba-cache-dtype sets both states and --mamba-ssm-cache-dtype, when not
// auto, overrides the recurrent one; both auto give fp8kv's defaults, a
// bfloat16 conv state and a float32 recurrent state (vLLM's auto is the
// model dtype). vLLM's float16 is refused as not supported. UsageError (exit
// 2) naming the flag. Models without linear-attention layers accept and
// ignore both (as vLLM).
inline StateDtype parse_state_dtype_flag(const std::string& text, const char* flag, StateDtype auto_dtype) {
  const char* accepted = auto_dtype == StateDtype::bf16 ? "auto, bfloat16 or float32" : "auto, float32 or bfloat16";
  if (text == "auto") return auto_dtype;
  if (text == "bfloat16") return StateDtype::bf16;
  if (text == "float32") return StateDtype::f32;
  if (text == "float16")
    throw UsageError(fmt::format("{}: float16 (a vLLM value) is not supported by fp8kv; give {}", flag, accepted));
  throw UsageError(fmt::format("{} must be {} (got '{}')", flag, accepted, text));
}
inline StateDtype parse_mamba_cache_dtype_flag(const std::string& text) {
  return parse_state_dtype_flag(text, "--mamba-cache-dtype", StateDtype::bf16);
}
// The recurrent state's: its own flag, else --mamba-cache-dtype's when that
// is given, else float32.
inline StateDtype parse_mamba_ssm_cache_dtype_flag(const std::string& text, const std::string& conv_text) {
  if (text == "auto" && conv_text != "auto") return parse_mamba_cache_dtype_flag(conv_text);
  return parse_state_dtype_flag(text, "--mamba-ssm-cache-dtype", StateDtype::f32);
}
inline const char* mamba_cache_dtype_help() {
  return "Linear-attention models (Qwen3.5): the state dtype, auto (= bfloat16 for the conv state, float32 for the "
         "recurrent one), bfloat16 or float32; as in vLLM it sets the recurrent state too unless "
         "--mamba-ssm-cache-dtype is given (vLLM's auto is the model dtype). Ignored by other models (default auto)";
}
inline const char* mamba_ssm_cache_dtype_help() {
  return "Linear-attention models (Qwen3.5): the recurrent (SSM) state's dtype, auto, float32 or bfloat16 (half the "
         "state pool's bytes; the state is rounded to bf16 once per step, at its end). auto follows "
         "--mamba-cache-dtype when that is given, as in vLLM, else float32. Ignored by other models (default auto)";
}

// Which flags a command takes: calibrate always observes a bf16 cache and
// eval compare/niah take the dtype from --arms, so they omit --kv-cache-dtype.
struct EngineFlagsShape {
  bool kv_cache_dtype = true;
  int default_max_num_seqs = 256;  // commands that run one sequence at a time size the default pool for 1
};

struct EngineFlags {
  using Shape = EngineFlagsShape;

  std::string kv_cache_dtype = "auto";
  int max_model_len = 0;
  int block_size = 16;
  std::string kv_memory;  // empty: engine default
  double gpu_memory_utilization = 0.0;  // 0: unset (0.9 on a GPU)
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;
  std::string backend = "auto";
  int threads = 0;
  std::string load_format = "auto";
  std::string fp8_weight_mode = "w8a16";
  std::string dtype = "auto";
  bool enforce_eager = false;
  bool enable_prefix_caching = true;
  int state_snapshot_interval = 0;  // 0: not given (automatic)
  std::string mamba_cache_dtype = "auto";
  std::string mamba_ssm_cache_dtype = "auto";
  std::string tokenizer;  // empty: the model directory
  int tensor_parallel_size = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double collective_timeout = 60.0;

  void add(CLI::App* sub, EngineFlagsShape shape = EngineFlagsShape{}) {
    max_num_seqs = shape.default_max_num_seqs;
    if (shape.kv_cache_dtype)
      sub->add_option("--kv-cache-dtype", kv_cache_dtype, kv_cache_dtype_help());
    // Omitted = the default; a given value must be valid (0 is not "default"):
    // docs/design.md "One rule per flag".
    sub->add_option("--max-model-len", max_model_len,
                    "Max tokens per sequence: N, or vLLM's 32k (x1000) / 32K (x1024) (default: the model's)")
        ->transform(token_count_rule())
        ->check(at_least(1));
    sub->add_option("--block-size", block_size, "Tokens per KV block (default 16)");
    sub->add_option("--kv-memory", kv_memory,
                    "KV cache budget: 512MiB, 80GB, bytes (default CPU: max-num-seqs full-length requests, capped at "
                    "a quarter of RAM)")
        ->check(non_empty("a size such as 512MiB"));
    sub->add_option("--gpu-memory-utilization", gpu_memory_utilization,
                    "cuda only: fraction of GPU memory the engine may use; the KV cache gets what weights and "
                    "activations leave (default 0.9)")
        ->check(in_range(0.0, 1.0, /*open_lo=*/true));  // omitted = default; 0 is refused
    sub->add_option("--max-num-seqs", max_num_seqs,
                    fmt::format("Sequences per step (default {})", shape.default_max_num_seqs));
    sub->add_option("--max-num-batched-tokens", max_num_batched_tokens,
                    "Tokens per step, also the longest prefill chunk (default 8192)");
    sub->add_option("--backend", backend, "auto (cuda when built with it and a GPU is present, else cpu), cpu, cuda");
    sub->add_option("--threads", threads,
                    "CPU threads (default 0: the CPUs this process may run on, its affinity mask and cgroup quota)");
    sub->add_option("--dtype", dtype,
                    "Weight/activation dtype, as vLLM's: auto (the checkpoint's) or bfloat16 (bf16); fp8kv computes "
                    "in the checkpoint's dtype (default auto)");
    sub->add_option("--load-format", load_format, "auto (the checkpoint) or dummy (random weights from config.json)");
    sub->add_option("--fp8-weight-mode", fp8_weight_mode,
                    "FP8-weight checkpoints: w8a16 (weights dequantized in the GEMM, the default) or w8a8 "
                    "(activations quantized dynamically to e4m3 per token / 1x128 group, as vLLM runs them)");
    sub->add_flag("--enforce-eager", enforce_eager, "cuda: no CUDA graphs");
    sub->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", enable_prefix_caching,
                  "Reuse the cached KV of shared prompt prefixes (default on)");
    sub->add_option("--state-snapshot-interval", state_snapshot_interval,
                    "Linear-attention models (Qwen3.5) with prefix caching: snapshot the per-sequence state every N "
                    "KV blocks; a prefix hit resumes from the longest snapshotted boundary (default: the least N, a "
                    "multiple of 64 tokens, at which a snapshot costs no more than the KV blocks it covers)")
        ->check(at_least(1));
    sub->add_option("--mamba-cache-dtype", mamba_cache_dtype, mamba_cache_dtype_help());
    sub->add_option("--mamba-ssm-cache-dtype", mamba_ssm_cache_dtype, mamba_ssm_cache_dtype_help());
    sub->add_option("--tokenizer", tokenizer, "Tokenizer directory or tokenizer.json (default: the model directory)");
    sub->add_option("--tensor-parallel-size,--tp", tensor_parallel_size,
                    "Tensor-parallel ranks: GPUs 0..N-1 on cuda, simulated ranks (threads) on cpu (default 1)");
    // One rank per process (docs/design.md, "Multi-process tensor parallelism").
    sub->add_option("--nnodes", nnodes,
                    "Processes of the tensor-parallel group, one rank each: 1 (default) or --tensor-parallel-size");
    sub->add_option("--node-rank", node_rank, "This process's rank (0: the one that schedules and prints; default 0)");
    sub->add_option("--master-addr", master_addr, "Address of rank 0's process (default 127.0.0.1)");
    sub->add_option("--master-port", master_port,
                    "Rank 0's control port; the collectives use the next port (default 29500)");
    // The watchdog (docs/tp.md "The watchdog").
    sub->add_option("--collective-timeout", collective_timeout,
                    "Seconds a rank waits for a peer process (startup, a collective, a control step) before every "
                    "rank stops with exit 1; a peer that exits stops them at once (default 60)")
        ->check(in_range(0.0, 1e6, /*open_lo=*/true));
  }

  // The tokenizer path for a model directory.
  std::filesystem::path tokenizer_path(const std::string& model) const {
    return tokenizer.empty() ? std::filesystem::path(model) : std::filesystem::path(tokenizer);
  }

  // Validated options (UsageError -> exit 2).
  EngineOptions options() const {
    auto at_least_1 = [](const char* flag, long v) {
      if (v < 1) throw UsageError(fmt::format("{} must be >= 1 (got {})", flag, v));
    };
    // 0 is the internal "not given" (the option's validator refuses an explicit 0).
    if (max_model_len < 0) throw UsageError(fmt::format("--max-model-len must be >= 1 (got {}; omit it for the model's)", max_model_len));
    at_least_1("--block-size", block_size);
    at_least_1("--max-num-seqs", max_num_seqs);
    at_least_1("--max-num-batched-tokens", max_num_batched_tokens);
    at_least_1("--tensor-parallel-size", tensor_parallel_size);
    if (threads < 0) throw UsageError(fmt::format("--threads must be >= 0 (got {}; 0: all hardware threads)", threads));
    const BackendChoice backend_choice = parse_backend_flag(backend);
    const LoadFormat load_format_choice = parse_load_format_flag(load_format);
    if (fp8_weight_mode != "w8a16" && fp8_weight_mode != "w8a8")
      throw UsageError(fmt::format("--fp8-weight-mode must be w8a16 or w8a8 (got '{}')", fp8_weight_mode));
    EngineOptions o;
    o.fp8_weight_mode = fp8_weight_mode == "w8a8" ? Fp8Compute::w8a8 : Fp8Compute::w8a16;
    o.kv_cache_dtype = parse_kv_cache_dtype_flag(kv_cache_dtype);
    o.conv_state_dtype = parse_mamba_cache_dtype_flag(mamba_cache_dtype);
    o.ssm_state_dtype = parse_mamba_ssm_cache_dtype_flag(mamba_ssm_cache_dtype, mamba_cache_dtype);
    o.max_model_len = max_model_len;
    o.block_size = block_size;
    if (!kv_memory.empty()) {
      o.kv_memory_bytes = parse_size_flag("--kv-memory", kv_memory);
    }
    if (dtype != "auto" && dtype != "bfloat16" && dtype != "bf16")
      throw UsageError(fmt::format("--dtype '{}': fp8kv runs the checkpoint's dtype; accepted: auto, bfloat16 (bf16)",
                                   dtype));
    if (gpu_memory_utilization != 0.0) {
      if (!(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0))
        throw UsageError(fmt::format("--gpu-memory-utilization must be in (0, 1] (got {})", gpu_memory_utilization));
      if (!kv_memory.empty()) throw UsageError("give --kv-memory or --gpu-memory-utilization, not both");
      if (backend_choice == BackendChoice::cpu)
        throw UsageError("--gpu-memory-utilization applies to --backend cuda only (use --kv-memory on the CPU)");
      o.gpu_memory_utilization = gpu_memory_utilization;
    }
    o.max_num_seqs = max_num_seqs;
    o.max_num_batched_tokens = max_num_batched_tokens;
    o.backend = backend_choice;
    o.num_threads = threads;
    // The CPUs this process may run on (affinity mask, cgroup quota): more
    // threads than that only oversubscribe (backend/cpu/thread_pool.h).
    const int hw = available_cpus();
    if (threads > hw) {
      std::fprintf(stderr, "warning: --threads %d exceeds the %d CPUs this process may run on; using %d\n", threads,
                   hw, hw);
      o.num_threads = hw;
    }
    o.load_format = load_format_choice;
    o.enforce_eager = enforce_eager;
    o.tensor_parallel_size = tensor_parallel_size;
    if (nnodes < 1) throw UsageError(fmt::format("--nnodes must be >= 1 (got {})", nnodes));
    if (node_rank < 0 || node_rank >= nnodes)
      throw UsageError(fmt::format("--node-rank {} is out of range for --nnodes {} (0..{})", node_rank, nnodes,
                                   nnodes - 1));
    if (nnodes > 1 && nnodes != tensor_parallel_size)
      throw UsageError(fmt::format("--nnodes {} with --tensor-parallel-size {}: one rank per process, so --nnodes "
                                   "must equal --tensor-parallel-size (or be 1)",
                                   nnodes, tensor_parallel_size));
    if (master_port < 1 || master_port > 65534)
      throw UsageError(fmt::format("--master-port must be in 1..65534 (got {}; the collectives use the next port)",
                                   master_port));
    if (master_addr.empty()) throw UsageError("--master-addr must not be empty");
    o.nnodes = nnodes;
    o.node_rank = node_rank;
    o.master_addr = master_addr;
    o.master_port = master_port;
    if (!(collective_timeout > 0 && collective_timeout <= 1e6))
      throw UsageError(fmt::format("--collective-timeout must be in (0, 1e6] seconds (got {})", collective_timeout));
    o.collective_timeout_s = collective_timeout;
    o.enable_prefix_caching = enable_prefix_caching;
    if (state_snapshot_interval < 0)
      throw UsageError(fmt::format("--state-snapshot-interval must be >= 1 (got {})", state_snapshot_interval));
    o.state_snapshot_interval = state_snapshot_interval;
    return o;
  }
};

// A subcommand on one checkpoint whose arguments (Args: .model, .engine)
// live for the program: MODEL_DIR first, then the command's own options
// (add_own(sub, args)), then the engine flags; run(args) is its action.
template <class Args, class Run, class AddOwn>
void add_model_command(CLI::App& app, const char* name, const char* about, Run run, AddOwn&& add_own) {
  static Args args;
  auto* sub = app.add_subcommand(name, about);
  sub->add_option("MODEL_DIR", args.model, "Checkpoint directory")->required();
  add_own(sub, args);
  args.engine.add(sub);
  set_action(sub, [run] { return run(args); });
}

}  // namespace fp8kv::cli
