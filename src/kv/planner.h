// KV capacity planning: ONE function sizes the pool for both the engine's
// allocator and `fp8kv capacity` (docs/design.md), following vLLM's hybrid
// allocator: layers are split into KV-cache groups of equal layer count
// (one attention type per group: full, or one sliding window); all groups
// draw equally sized pages from one pool. A page (one "block") holds
// block_size tokens of K and V for every layer of a group.
//
// What is mirrored from vLLM (vllm/v1/core/kv_cache_utils.py,
// vllm/v1/kv_cache_interface.py) and where we differ: docs/capacity.md.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kv/state_plan.h"
#include "model/config.h"
#include "numerics/fp8.h"

namespace fp8kv {

// vLLM's serving defaults, shared by the engine flags (cli/engine_flags.h)
// and `fp8kv capacity` (docs/capacity.md).
inline constexpr int kDefaultMaxNumSeqs = 256;
inline constexpr int kDefaultMaxNumBatchedTokens = 8192;
inline constexpr int kDefaultBlockSize = 16;
inline constexpr double kDefaultGpuMemoryUtilization = 0.9;

struct KvPlanSettings {
  uint64_t kv_memory_bytes = 0;     // budget for the KV cache itself, per rank
  int max_model_len = 0;            // 0: the model's max_position_embeddings
  int max_num_seqs = kDefaultMaxNumSeqs;
  int max_num_batched_tokens = kDefaultMaxNumBatchedTokens;  // also the in-flight tokens a sliding layer must keep
  int block_size = kDefaultBlockSize;
  KvDtype dtype = KvDtype::bf16;
  int tensor_parallel_size = 1;
  // Where kv_memory_bytes came from, for errors about the budget: a flag
  // ("--kv-memory", "--gpu-memory", "--gpu-memory-utilization") or
  // "the default KV budget" (KvBudget::source).
  std::string budget_source = "--kv-memory";
  // Linear-attention models (kv/state_plan.h): the state dtypes.
  StateDtype conv_state_dtype = StateDtype::bf16;
  StateDtype ssm_state_dtype = StateDtype::f32;
  // Prefix caching (the engine's --enable-prefix-caching): on a model with a
  // state pool it adds the state snapshot pool, which shares the budget with
  // the KV blocks (docs/design.md "Prefix snapshots of the linear-attention
  // state"). No effect on other models.
  bool prefix_caching = false;
  // --state-snapshot-interval: blocks between snapshot boundaries; 0: auto
  // (auto_snapshot_interval).
  int state_snapshot_interval = 0;
};

struct KvGroupPlan {
  LayerType type = LayerType::full_attention;
  int window = 0;                 // 0 for full attention
  std::vector<int> layers;        // model layer indices in this group (may be padded: see group_size)
  uint64_t bytes_per_token = 0;   // per rank, K+V, all layers of this group
  int64_t blocks_per_request = 0; // blocks one sequence of max_model_len needs in this group
};

struct KvPlan {
  KvDtype dtype = KvDtype::bf16;
  int block_size = 16;
  int max_model_len = 0;
  int group_size = 0;             // layers per group (all groups equal)
  int kv_heads_per_rank = 0;
  int head_dim = 0;
  uint64_t page_bytes = 0;        // bytes of one block: block_size x group_size layers x K+V
  int64_t num_blocks = 0;         // pool size in blocks
  std::vector<KvGroupPlan> groups;
  int64_t blocks_per_request = 0; // sum over groups
  double max_concurrency = 0.0;   // requests of max_model_len that fit
  int64_t tokens = 0;             // floor(max_concurrency * max_model_len)
  uint64_t bytes_per_token = 0;   // per rank, all attention layers (marginal cost of a token)

  // Added fields (compatible extension).
  uint64_t kv_memory_bytes = 0;   // the budget the plan was made for
  int max_num_batched_tokens = 0;
  int tensor_parallel_size = 1;
  // Bytes of one layer's K (or V) block: block_size x kv_heads_per_rank x
  // head_dim x dtype bytes (KvCacheLayout::block_bytes()). page_bytes =
  // 2 x group_size x (layer_block_bytes + layer_scale_block_bytes).
  uint64_t layer_block_bytes = 0;
  // Bytes of one layer's K (or V) per-token-head scales per block: block_size x
  // kv_heads_per_rank x 4 (KvCacheLayout::scale_block_bytes()); 0 for the other dtypes.
  uint64_t layer_scale_block_bytes = 0;
  // num_blocks x page_bytes: what the engine allocates (<= kv_memory_bytes).
  uint64_t pool_bytes() const { return static_cast<uint64_t>(num_blocks) * page_bytes; }
  // What vLLM logs as "GPU KV cache size: N tokens":
  // num_blocks / num_groups * block_size (integer division). Equals `tokens`
  // for a dense model whose max_model_len is a multiple of block_size.
  int64_t vllm_logged_tokens = 0;
  // The per-sequence state pool of the linear-attention layers (empty for
  // other models): state.pool_bytes() comes out of kv_memory_bytes before
  // the KV blocks are carved. groups cover the attention layers only.
  StatePlan state;
  // Prefix caching was asked for on a model with a state pool but cannot
  // run: why (the engine logs it and keeps caching off). Empty otherwise.
  std::string prefix_caching_off_reason;
};

// The GDN chunked form's alignment (backend/cpu/gdn.h kGdnChunk): a prefill
// split at a multiple of it keeps the one-shot bits, so automatic snapshot
// boundaries fall on multiples of it.
inline constexpr int kSnapshotAlignTokens = 64;

// The automatic snapshot interval of a plan with a state pool (blocks): the
// smallest multiple of kSnapshotAlignTokens / block_size (made whole) at
// which one snapshot costs no more than the KV pages of the blocks between
// two boundaries (interval x KV groups x page_bytes >= state bytes per
// sequence), so snapshots take at most half of what they share with the KV
// blocks.
int auto_snapshot_interval(const KvPlan& p);

// Throws InputError (with what would fit) on bad settings or when memory is
// too small for one sequence of max_model_len.
KvPlan plan_kv_cache(const ModelConfig& cfg, const KvPlanSettings& s);

// "80GiB", "512MiB" (binary), "80GB" (decimal), plain bytes. Throws InputError.
uint64_t parse_size(const std::string& s);

// ---- helpers shared by the engine and `fp8kv capacity` ----

// The line the engine logs after sizing its pool, e.g.
// "KV cache: 131072 tokens (8192 blocks of 16), max concurrency 1.00x at
// max_model_len 131072, dtype bf16". Both sides print it from the same plan.
// With sliding windows or several KV-cache groups, where blocks x block_size
// is not the tokens, it gives the arithmetic: "KV cache: 969343 tokens = max
// concurrency 7.40x at max_model_len 131072 (pool: 81920 blocks of 16 tokens
// shared by 6 KV-cache groups of 8 layers; a request of max_model_len takes
// 8192 in full attention + 5 x 577 in sliding window 1024 = 11077 blocks),
// dtype bf16".
std::string kv_plan_log_line(const KvPlan& p);

// KV heads held by one rank: max(1, num_kv_heads / tp), as vLLM. When tp >
// num_kv_heads each KV head is replicated on tp / num_kv_heads ranks. Throws
// InputError when tp does not divide num_kv_heads (tp <= kv heads), kv heads
// do not divide tp (tp > kv heads), or tp does not divide num_heads.
int kv_heads_per_rank(const ModelConfig& cfg, int tensor_parallel_size);

// Bytes one request of s.max_model_len holds at most (blocks_per_request x
// page_bytes): the least kv_memory_bytes for which plan_kv_cache succeeds.
// Throws InputError on bad settings (not on too little memory).
uint64_t kv_memory_needed(const ModelConfig& cfg, const KvPlanSettings& s);

// Largest max_model_len (<= s.max_model_len, or the model's limit when 0)
// whose single request fits in s.kv_memory_bytes; 0 when not even one token
// fits. Mirrors vLLM's estimate_max_model_len (binary search).
int max_model_len_that_fits(const ModelConfig& cfg, const KvPlanSettings& s);

// The longest max_model_len the planner accepts for this model: its
// max_position_embeddings (scaled by the RoPE factor for linear / dynamic /
// yarn scaling, as vLLM derives it).
int model_max_len(const ModelConfig& cfg);

// Where s's max_model_len comes from, for messages: "--max-model-len" when
// given, else the model's limit (max_position_embeddings in config.json,
// times the RoPE factor where it applies).
std::string max_model_len_origin(const ModelConfig& cfg, const KvPlanSettings& s);

// ---- the memory budget (docs/capacity.md "Memory budget") ----
// Every size below is computed with overflow checks: a product that does not
// fit in 64 bits is an InputError naming its factors (docs/design.md).

// What the KV cache may use, and how it was derived.
struct KvBudget {
  uint64_t kv_memory_bytes = 0;
  std::string source = "--kv-memory";  // KvPlanSettings::budget_source
  // From GPU memory only (from_gpu):
  bool from_gpu = false;
  uint64_t gpu_memory_bytes = 0;        // per rank
  double gpu_memory_utilization = 0.0;
  uint64_t weights_bytes_per_rank = 0;
  std::string weights_source;           // "checkpoint" | "estimate" | "measured"
  uint64_t activation_bytes = 0;        // per rank
};

// The inputs of vLLM's rule kv = floor(gpu x utilization) - weights - activations.
struct GpuMemoryInputs {
  uint64_t gpu_memory_bytes = 0;  // total memory of one GPU (rank)
  std::string gpu_memory_what = "--gpu-memory";  // how errors name it
  double utilization = kDefaultGpuMemoryUtilization;
  std::string utilization_flag = "--gpu-memory-utilization";
  uint64_t weights_bytes_per_rank = 0;  // weights_per_rank(total, tp), or measured
  std::string weights_source;
  uint64_t activation_bytes = 0;        // estimate_activation_bytes, or measured (then in weights)
};

// The KV budget from GPU memory. Throws InputError when nothing is left, or,
// with `probe`, when one request of probe->max_model_len does not fit (the
// message then gives the GPU memory and the max_model_len that would).
KvBudget kv_budget_from_gpu(const GpuMemoryInputs& in, const ModelConfig& cfg,
                            const KvPlanSettings* probe = nullptr);

// The engine's default budget on the CPU (no --kv-memory): room for
// max_num_seqs requests of max_model_len, capped at a quarter of
// `physical_memory` but always one full request. Pages are backed lazily.
// Throws InputError, before anything is allocated, when one request of
// max_model_len needs more than `physical_memory` (when known; the engine
// passes host_memory_limit(), named by `memory_what`): the message names
// max_model_len, where it came from, the bytes and the largest
// --max-model-len that fits.
KvBudget default_cpu_kv_budget(const ModelConfig& cfg, const KvPlanSettings& s, uint64_t physical_memory,
                               std::string_view memory_what = "this machine's physical memory");

// Whole-model weights divided over tp ranks (vLLM shards embeddings and
// lm_head too; replicated norms are negligible).
uint64_t weights_per_rank(uint64_t total_bytes, int tensor_parallel_size);
// Parameter count of the llama-style blocks ModelConfig covers, from the config
// (qwen3_5: gated q_proj, and the Gated DeltaNet layers' own tensors).
uint64_t estimate_parameters(const ModelConfig& cfg);
// estimate_parameters x torch_dtype bytes (float32 4, fp8 1, else 2); for
// an FP8-weight config (quantization_config), the projections it quantizes
// at 1 byte per element plus their f32 scales.
uint64_t estimate_weight_bytes(const ModelConfig& cfg);
// The bytes an FP8-weight config's quantized projections save against
// elem_bytes per element (each at 1 byte plus its f32 scales; excluded
// modules by the format's own rule); 0 without a quantization_config.
uint64_t fp8_projection_savings(const ModelConfig& cfg, uint64_t elem_bytes);
// What estimate_weight_bytes assumed, for the printed weights source:
// "estimate", or for an FP8-weight config the bytes per element it counted.
std::string weight_estimate_source(const ModelConfig& cfg);
// Peak activation estimate of one profiling step, per rank: the live bf16
// tensors of one layer for max_num_batched_tokens tokens plus fp32 logits for
// max_num_seqs sampled positions.
uint64_t estimate_activation_bytes(const ModelConfig& cfg, int max_num_batched_tokens, int max_num_seqs,
                                   int tensor_parallel_size);

// Human-readable size with binary units ("1.50 GiB"), for messages.
std::string format_bytes(uint64_t bytes);

}  // namespace fp8kv
