// Megatron-style sharding of one model over tensor-parallel ranks
// (docs/design.md, "Tensor parallelism"). Pure host-side functions: the
// ModelRunner of each rank applies them to the full config / weights / KV
// scales and uploads only its shard.
//
//   q/k/v, gate/up  column-parallel: the rows of W (output features) split by
//                   heads / by ffn; their biases split the same way. A gated
//                   q_proj (qwen3_5: per head D query rows, then D gate rows)
//                   splits by heads too, 2 D rows per head.
//   o/down          row-parallel: the columns of W (input features) split the
//                   same way; partial sums added by Backend::all_reduce; the
//                   bias is kept on rank 0 only (added once, as vLLM's
//                   RowParallelLinear does).
//   KV heads        split across ranks; when num_kv_heads < world each KV head
//                   is replicated on world / num_kv_heads ranks (vLLM), so
//                   every rank holds kv_heads_per_rank() heads.
//   Gated DeltaNet  (qwen3_5 linear_attention layers) the linear heads split
//                   like attention heads: rank r holds key heads
//                   [r Hk/N, (r+1) Hk/N) and value heads [r Hv/N, (r+1) Hv/N)
//                   (key head h still serves value heads h Hv/Hk ..). in_proj_qkv
//                   and conv1d keep the rank's rows of each of their q, k, v
//                   segments (a gather: q | k | v per rank); in_proj_z by value
//                   heads (Dv rows each), in_proj_b / in_proj_a, A_log and
//                   dt_bias by value heads; out_proj row-parallel (columns by
//                   value heads); the gated norm (per Dv) replicated. The
//                   state pool is per rank (kv/state_plan.h).
//   QK-norm, norms  replicated (per head_dim / per hidden, not per head).
//   embedding       replicated (a gather of T rows; sharding it would cost an
//                   all-reduce of [T][H] per step for no bandwidth gain).
//   lm_head         vocab-parallel when world divides vocab_size (each rank
//                   computes V/world logits, Backend::all_gather joins them),
//                   else replicated.
//   fp8 weights     scales shard with what they scale: per-channel scales with
//                   their rows; a per-tensor scale replicated; 128x128 block
//                   scales with their blocks, so every rank's rows (column-
//                   parallel) or columns (row-parallel) of a block-scaled
//                   matrix must start and end on a 128 boundary (or the
//                   matrix's end): check_fp8_block_shards.
//   KV scales       per-head values sharded with their heads (q with q heads,
//                   k/v with the rank's KV heads), per-tensor replicated.
#pragma once
#include <memory>

#include "kv/kv_scales.h"
#include "model/config.h"

namespace fp8kv {

class ModelWeights;

struct TpShard {
  int rank = 0;
  int world = 1;
  // The weights given to this rank are already its shard (per-rank dummy
  // weights): shard_weights returns them as they are.
  bool presharded = false;
};

// Throws InputError naming the values when `world` does not divide
// num_heads or intermediate_size, the KV heads cannot be split or
// replicated evenly (kv/planner.h kv_heads_per_rank), or (Gated DeltaNet)
// it does not divide linear_num_key_heads and linear_num_value_heads.
void check_tensor_parallel(const ModelConfig& cfg, int world);

// FP8 block-wise (128x128) weights: throws InputError naming the matrix, its
// shape, the tensor-parallel size, the rank's rows or columns and the 128
// block when a rank's cut of a block-scaled matrix does not start and end on
// a block boundary (a block's scale cannot be split). Other granularities,
// and world 1, always pass. The first form checks the loaded matrices (those
// stored fp8); the second what the config's quantization_config declares
// (default naming, as dummy weights quantize). Both call
// check_tensor_parallel first.
void check_fp8_block_shards(const ModelWeights& w, const ModelConfig& cfg, int world);
void check_fp8_block_shards(const ModelConfig& cfg, int world);

// The config one rank runs: num_heads / world query heads, kv_heads_per_rank
// KV heads, intermediate_size / world, and (Gated DeltaNet) the linear key and
// value heads / world. vocab_size, hidden_size, head_dim and everything else
// unchanged.
ModelConfig shard_config(const ModelConfig& cfg, int world);

// The shapes one rank streams per decode step (bench floors: weights / N
// plus the rank's KV heads): shard_config with vocab_size / world when the
// LM head is vocab-parallel. world 1: cfg.
ModelConfig rank_traffic_config(const ModelConfig& cfg, int world);

// True when the LM head is split by vocabulary rows (world divides vocab_size).
bool vocab_parallel(const ModelConfig& cfg, int world);

// First global KV head rank `rank` holds (it holds kv_heads_per_rank heads).
int first_kv_head(const ModelConfig& cfg, const TpShard& t);

// The rank's weights: row slices are zero-copy views into `w` (kept alive);
// column slices (o_proj, down_proj, out_proj) and row gathers (in_proj_qkv)
// are copies. fp8 matrices keep their scales' shard (see above); a block cut
// off a 128 boundary throws InputError (check_fp8_block_shards). world 1
// returns `w`.
std::shared_ptr<const ModelWeights> shard_weights(std::shared_ptr<const ModelWeights> w, const ModelConfig& cfg,
                                                  const TpShard& t);

// `--load-format dummy` per rank: bitwise shard_weights(dummy_weights(cfg,
// seed, std), cfg, t), generating only the rank's slices (the replicated
// embedding in full), so N ranks need ~1/N of the host memory of the
// full model each. fp8 projections (a quantization_config) are quantized
// with the scales of the full matrix's cells, as dummy_weights does (a
// per-tensor or per-channel scale reads the whole matrix / row: compute, not
// memory). world 1: dummy_weights.
std::shared_ptr<ModelWeights> dummy_weights_shard(const ModelConfig& cfg, const TpShard& t, uint64_t seed = 0,
                                                  float std = 0.02f);

// The rank's KV scales (validated global scales in).
KvScales shard_kv_scales(const KvScales& s, const ModelConfig& cfg, const TpShard& t);

}  // namespace fp8kv
