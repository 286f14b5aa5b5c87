// The inference engine: a model (weights + config) on a paged KV cache
// (bf16 / fp8_e4m3 / fp8_e5m2) with per-layer KvScales, driven by a
// continuous-batching step loop. This is the API calibration, evaluation,
// the CLI and the server call.
//
// Threading: an Engine is driven by one thread at a time; the math inside a
// call is parallelized with OpenMP (num_threads), and results do not depend on
// the thread count (fixed reduction order).
//
// Typical use:
//   EngineOptions o; o.kv_cache_dtype = "fp8";
//   auto eng = Engine::load("models/tiny", o);
//   eng->set_kv_scales(scales);                 // optional (default unity)
//   ScoreResult r = eng->score(ids, {}, [&](int pos, std::span<const float> logits) { ... });
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend_choice.h"
#include "backend/kv_clips.h"
#include "backend/store_observer.h"
#include "kv/kv_scales.h"
#include "kv/planner.h"
#include "model/config.h"
#include "numerics/fp8.h"

namespace fp8kv {

class ModelWeights;  // model/weights.h

// --kv-cache-dtype, parsed: auto (nullopt) or a KvDtype. The CLI parses the
// flag once (cli/engine_flags.h parse_kv_cache_dtype_flag); a program or a
// test may assign a KvDtype or one of the names of numerics/fp8.h
// kv_cache_dtype_names() (parsed on assignment; std::invalid_argument on an
// unknown name).
struct KvCacheDtypeSetting {
  std::optional<KvDtype> dtype;  // nullopt: auto
  KvCacheDtypeSetting() = default;
  KvCacheDtypeSetting(KvDtype d) : dtype(d) {}                                     // NOLINT: implicit by design
  KvCacheDtypeSetting(std::string_view name) : dtype(parse_kv_cache_dtype(name)) {}  // NOLINT
  KvCacheDtypeSetting(const std::string& name) : KvCacheDtypeSetting(std::string_view(name)) {}  // NOLINT
  KvCacheDtypeSetting(const char* name) : KvCacheDtypeSetting(std::string_view(name)) {}        // NOLINT
  bool is_auto() const { return !dtype; }
  bool operator==(const KvCacheDtypeSetting&) const = default;
};

// --load-format, parsed once by the CLI (cli/engine_flags.h).
enum class LoadFormat : uint8_t {
  auto_,  // the checkpoint's weights
  dummy,  // random weights from config.json alone (no safetensors read)
};

struct EngineOptions {
  // auto: bf16 unless the checkpoint declares an fp8 KV scheme (config.json
  // quantization_config.kv_cache_scheme, or hf_quant_config.json
  // kv_cache_quant_algo).
  KvCacheDtypeSetting kv_cache_dtype;
  // KV pool budget in bytes (per rank). 0: on the CPU, enough for
  // max_num_seqs requests of max_model_len, capped at a quarter of physical
  // memory but always one full request (pages are allocated lazily by the OS,
  // so a large pool costs nothing until used); on a GPU, see
  // gpu_memory_utilization.
  uint64_t kv_memory_bytes = 0;
  // GPU only (0: unset = 0.9 on a GPU): the fraction of total device memory
  // the engine may use; the KV cache gets what the weights and the
  // activations leave of it (vLLM's meaning). Refused on the CPU backend and
  // together with kv_memory_bytes.
  double gpu_memory_utilization = 0.0;
  int max_model_len = 0;             // 0: the model's max_position_embeddings
  int block_size = 16;               // tokens per KV page
  int num_threads = 0;               // 0: OpenMP default
  int max_num_seqs = 256;            // sequences in one step (continuous batching; vLLM's default)
  int max_num_batched_tokens = 8192; // tokens in one step; also the max prefill chunk (vLLM's default)
  // --backend and --load-format, parsed once by the CLI (cli/engine_flags.h).
  // backend: auto_ (cuda when built with it and a GPU is present, else cpu) | cpu | cuda.
  BackendChoice backend = BackendChoice::auto_;
  // load_format: auto_ (the checkpoint's weights) | dummy (random weights from config.json alone).
  LoadFormat load_format = LoadFormat::auto_;
  // FP8-weight checkpoints (model/quant_config.h; docs/design.md "FP8-weight
  // checkpoints"): w8a16 dequantizes the weight inside the GEMM; w8a8
  // quantizes activations dynamically (per token, or per 1x128 group for
  // block-wise weights). Both backends (cuda: compute capability 9.0; its
  // decode rows keep the fp8 GEMV, docs/cuda_backend.md "FP8 weights").
  Fp8Compute fp8_weight_mode = Fp8Compute::w8a16;
  bool enforce_eager = false;        // cuda: no CUDA graphs
  // Megatron tensor parallelism over this many ranks (vLLM's
  // --tensor-parallel-size): GPUs 0..N-1 on cuda, simulated ranks (threads)
  // on the cpu. docs/design.md, "Tensor parallelism".
  int tensor_parallel_size = 1;
  // One rank per process (vLLM's --nnodes / --node-rank / --master-addr /
  // --master-port; engine/tp_runner.h TpMultiProcess): nnodes 1 = every
  // rank in this process; else nnodes == tensor_parallel_size. In a process
  // with node_rank > 0, Engine::load (and create) serves rank 0's steps and returns
  // nullptr once rank 0's engine is destroyed (docs/design.md,
  // "Multi-process tensor parallelism").
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // The watchdog's bound in seconds (--collective-timeout; TpMultiProcess):
  // a peer process silent this long, or gone, ends every rank (exit 1).
  double collective_timeout_s = 60.0;
  // Tests: pad decode steps to the CUDA-graph buckets and use their decode
  // plan, but run eagerly (the reference a graph replay equals bitwise).
  bool pad_decode_eager = false;
  // Tests: tensor-parallel ranks capture CUDA graphs too (off in production
  // until a multi-GPU run has checked them: TP ranks run eagerly; docs/tp.md).
  bool tp_cuda_graphs = false;
  // Automatic prefix caching (vLLM's --enable-prefix-caching, on by default
  // as in vLLM V1): generation requests reuse the cached K/V of the longest
  // run of full blocks they share with earlier requests (docs/design.md
  // "Prefix caching"). Scoring never reuses; a store observer turns it off
  // while attached (it must see every token); set_kv_scales empties it.
  bool enable_prefix_caching = true;
  // Models with linear_attention layers (Qwen3.5), with prefix caching on:
  // the per-sequence state is snapshotted every this many blocks (vLLM's
  // "align" idea), and a hit resumes from the longest cached boundary with a
  // snapshot; 0: automatic (kv/planner.h auto_snapshot_interval). The
  // snapshot pool shares the KV budget (docs/design.md "Prefix snapshots of
  // the linear-attention state").
  int state_snapshot_interval = 0;
  // Models with linear_attention layers: the element types of the
  // per-sequence state pool (kv/state_plan.h; docs/design.md "Qwen3.5
  // hybrids"): the conv state (--mamba-cache-dtype, bf16 by default) and the
  // recurrent state (--mamba-ssm-cache-dtype, f32 by default; bf16 is
  // rounded once per step, when the step stores it). No effect on other
  // models.
  StateDtype conv_state_dtype = StateDtype::bf16;
  StateDtype ssm_state_dtype = StateDtype::f32;
};

// Prefix cache counters, in tokens (vLLM's prefix_cache_queries / hits).
struct PrefixCacheStats {
  int64_t queries = 0;          // prompt tokens (+ generated, after a preemption) looked up at admission
  int64_t hits = 0;             // of those, tokens whose K/V were reused
  int64_t computed_tokens = 0;  // tokens run through the forward pass (prefill + decode)
  int64_t cached_blocks = 0;    // pages registered now (held or free)
};

// Resolves auto against a checkpoint directory (see EngineOptions); a
// concrete dtype is returned as is.
KvDtype resolve_kv_cache_dtype(const KvCacheDtypeSetting& requested, const std::filesystem::path& model_dir);

struct ScoreOptions {
  int chunk_size = 0;  // prefill chunk (tokens per forward); 0: max_num_batched_tokens
};

// Teacher-forced scoring of one sequence of n tokens.
struct ScoreResult {
  std::vector<int> token_ids;
  std::vector<std::optional<double>> logprobs;  // [i] = log P(token_i | tokens < i); [0] = nullopt
  std::vector<std::optional<int>> top1_ids;     // argmax of that distribution (ties: lowest id); [0] = nullopt
};

// Called once per position i in [0, n) of a scored sequence, in order, with
// the full logits row (after any final softcapping) of the distribution of
// token i+1 given tokens[0..i] (for i = n-1: the next, unseen token). The span
// is valid only during the call.
using LogitsCallback = std::function<void(int position, std::span<const float> logits)>;
using BatchLogitsCallback = std::function<void(int sequence, int position, std::span<const float> logits)>;

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, ties -> lowest id)
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0: off
  uint64_t seed = 0;
};

struct GenerateOptions {
  int max_tokens = 256;            // new tokens at most
  SamplingParams sampling;
  bool stop_at_eos = true;         // config eos_token_ids
  std::vector<int> stop_token_ids; // extra stop ids
  int chunk_size = 0;              // prompt prefill chunk; 0: max_num_batched_tokens
  // >= 0: each StepEvent carries the sampled token's logprob and this many
  // most likely alternatives, from the model's raw distribution (before
  // temperature / top-k / top-p, as vLLM's default). -1: none (no extra cost).
  int logprobs = -1;
};

enum class FinishReason { stop, length, cancelled };
std::string_view finish_reason_name(FinishReason r);  // "stop" | "length" | "cancelled"

struct GenerateResult {
  std::vector<int> tokens;  // generated ids (a stop token, when hit, is included)
  FinishReason finish = FinishReason::length;
  int prompt_tokens = 0;
  double prefill_seconds = 0.0;  // wall time until the first token was sampled
  double decode_seconds = 0.0;   // wall time of the remaining steps
};

// Per generated token; return false to stop (finish = cancelled).
using TokenCallback = std::function<bool(int token)>;

// ---- Continuous batching (the server drives this) ----
using RequestId = uint64_t;
struct Request {
  std::vector<int> prompt;
  GenerateOptions options;
};
struct TokenLogprob {
  int token = -1;
  float logprob = 0.0f;
};
struct StepEvent {
  RequestId id = 0;
  int token = -1;                       // the token produced this step
  std::optional<FinishReason> finished; // set on the request's last event
  // With GenerateOptions::logprobs >= 0 and token >= 0: log P(token) and the
  // top alternatives (descending, ties -> lowest id).
  std::optional<float> logprob;
  std::vector<TokenLogprob> top_logprobs;
};

class Engine {
 public:
  // Loads config, weights and (with a fitting tokenizer elsewhere) sizes the
  // KV pool with plan_kv_cache and logs one line:
  //   KV cache: N tokens (M blocks of B), max concurrency X at max_model_len L, dtype D
  // Throws InputError naming the file/tensor on a bad checkpoint, or when the
  // weights would not fit in memory. A multi-process follower (nnodes > 1,
  // node_rank > 0) has no engine of its own: load serves rank 0's steps and
  // returns nullptr when rank 0 shuts the group down; the caller then ends
  // its command with success (the work and its output belong to rank 0).
  static std::unique_ptr<Engine> load(const std::filesystem::path& model_dir, const EngineOptions& opts);
  // From in-memory weights (tests). kv_cache_dtype auto means bf16 here. A
  // multi-process follower serves rank 0's steps and returns nullptr, as in load.
  static std::unique_ptr<Engine> create(ModelConfig cfg, std::shared_ptr<const ModelWeights> weights,
                                        const EngineOptions& opts);
  virtual ~Engine() = default;

  virtual const ModelConfig& config() const = 0;
  virtual KvDtype kv_dtype() const = 0;
  virtual const KvPlan& kv_plan() const = 0;
  virtual int max_model_len() const = 0;
  virtual std::string_view backend_name() const = 0;  // "cpu" | "cuda"

  // Scales default to unity. Throws InputError when the layer count or a
  // per-head count does not match the model, or a value is not finite and > 0.
  virtual void set_kv_scales(KvScales scales) = 0;
  virtual const KvScales& kv_scales() const = 0;

  // Called at the single store point of every layer (not owned; nullptr detaches).
  virtual void set_store_observer(StoreObserver* observer) = 0;

  // Teacher-forced scoring with chunked prefill. A sequence longer than
  // max_model_len, empty, or with ids outside the vocabulary -> InputError.
  virtual ScoreResult score(std::span<const int> tokens, const ScoreOptions& opts = {},
                            const LogitsCallback& on_logits = {}) = 0;
  // Several sequences scored together (batched steps); results equal scoring
  // each alone (within fp32 rounding of the batched GEMMs).
  virtual std::vector<ScoreResult> score_batch(std::span<const std::vector<int>> sequences,
                                               const ScoreOptions& opts = {},
                                               const BatchLogitsCallback& on_logits = {}) = 0;

  // Generation from prompt ids (greedy by default). The prompt plus max_tokens
  // is clipped to max_model_len (finish = length); an empty prompt or one
  // longer than max_model_len - 1 -> InputError.
  virtual GenerateResult generate(std::span<const int> prompt, const GenerateOptions& opts = {},
                                  const TokenCallback& on_token = {}) = 0;

  // Continuous batching: submit requests, then call step() until idle. Each
  // step runs one forward over all running sequences (prefill chunks and
  // decodes mixed, at most max_num_batched_tokens tokens) and returns the
  // tokens produced. Requests wait when the KV pool is full.
  virtual RequestId submit(Request request) = 0;
  virtual void cancel(RequestId id) = 0;
  virtual std::vector<StepEvent> step() = 0;
  virtual bool idle() const = 0;
  // Requests admitted to the batch / queued for admission (server metrics).
  virtual int num_running() const = 0;
  virtual int num_waiting() const = 0;

  // KV pool state (tests, server metrics).
  virtual int64_t free_kv_blocks() const = 0;
  // Requests preempted (by recompute) so far: the pool was full.
  virtual int64_t num_preemptions() const = 0;
  // Decode steps run by replaying a CUDA graph / graphs captured so far (0 on the CPU).
  virtual int64_t graph_replays() const { return 0; }
  virtual int64_t graph_captures() const { return 0; }
  virtual PrefixCacheStats prefix_cache_stats() const { return {}; }
  // KV store saturation per layer (docs/robustness.md "KV clipping";
  // backend/kv_clips.h), summed over the tensor-parallel ranks since load
  // (each KV head once). nullopt: not counted. Multi-process TP: every rank's
  // counts, gathered by this call over the control channel (call it between
  // steps, on the thread that steps). The engine also warns once per layer
  // and stream when more than 0.1% of the elements stored so far clipped.
  virtual std::optional<std::vector<KvClipCounts>> kv_clip_counts() const { return std::nullopt; }
};

}  // namespace fp8kv
