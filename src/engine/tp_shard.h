// Megatron-style sharding of one model over tensor-parallel ranks
// (docs/design.md, "Tensor parallelism"). Pure host-side functions: the
// ModelRunner of each rank applies them to the full config / weights / KV
// scales and uploads only its shard.
//
//   q/k/v, gate/up  column-parallel: the rows of W (output features) split by
//                   heads / by ffn; their biases split the same way.
//   o/down          row-parallel: the columns of W (input features) split the
//                   same way; partial sums added by Backend::all_reduce; the
//                   bias is kept on rank 0 only (added once, as vLLM's
//                   RowParallelLinear does).
//   KV heads        split across ranks; when num_kv_heads < world each KV head
//                   is replicated on world / num_kv_heads ranks (vLLM), so
//                   every rank holds kv_heads_per_rank() heads.
//   QK-norm, norms  replicated (per head_dim / per hidden, not per head).
//   embedding       replicated (a gather of T rows; sharding it would cost an
//                   all-reduce of [T][H] per step for no bandwidth gain).
//   lm_head         vocab-parallel when world divides vocab_size (each rank
//                   computes V/world logits, Backend::all_gather joins them),
//                   else replicated.
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
// num_heads or intermediate_size, or the KV heads cannot be split or
// replicated evenly (kv/planner.h kv_heads_per_rank).
void check_tensor_parallel(const ModelConfig& cfg, int world);

// The config one rank runs: num_heads / world query heads, kv_heads_per_rank
// KV heads, intermediate_size / world. vocab_size, hidden_size, head_dim and
// everything else unchanged.
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
// column slices (o_proj, down_proj) are copies. world 1 returns `w`.
std::shared_ptr<const ModelWeights> shard_weights(std::shared_ptr<const ModelWeights> w, const ModelConfig& cfg,
                                                  const TpShard& t);

// The rank's KV scales (validated global scales in).
// `--load-format dummy` per rank: bitwise shard_weights(dummy_weights(cfg,
// seed, std), cfg, t), generating only the rank's slices (the replicated
// embedding in full), so N ranks need ~1/N of the host memory of the
// full model each. world 1: dummy_weights.
std::shared_ptr<const ModelWeights> dummy_weights_shard(const ModelConfig& cfg, const TpShard& t, uint64_t seed = 0,
                                                        float std = 0.02f);

KvScales shard_kv_scales(const KvScales& s, const ModelConfig& cfg, const TpShard& t);

}  // namespace fp8kv
