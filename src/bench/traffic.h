// Bytes a decode step must move (the bandwidth floor of docs/bench.md):
// every weight matrix streamed once per step (bf16: what the model needs at
// least, whatever a backend widens it to), the embedding rows gathered for
// the batch (not the whole table), and the K/V each sequence attends over
// (sliding layers: the window only) in the cache dtype.
#pragma once
#include <cstdint>
#include <span>

#include "kv/state_plan.h"
#include "model/config.h"
#include "numerics/fp8.h"

namespace fp8kv::bench {

// Parameters read per token by the layers and the LM head (norm gains and
// biases included; the untied input embedding excluded: decode_weight_bytes
// adds the batch's rows).
uint64_t streamed_weight_params(const ModelConfig& c);

// Weights streamed per decode step of `batch` sequences: streamed params x
// weight_elem_bytes + the batch's embedding rows. With a quantization_config
// (FP8 weights) every layer projection counts 1 byte per parameter plus its
// f32 scales (kv/planner.h fp8_projection_savings: excluded modules stay at
// weight_elem_bytes); the LM head and the embedding always count at
// weight_elem_bytes, as the block-wise checkpoints store them.
uint64_t decode_weight_bytes(const ModelConfig& c, int batch, int weight_elem_bytes = 2);

// The per-sequence states of the linear-attention (Gated DeltaNet) layers a
// decode step of `batch` sequences reads and writes, in the engine's state
// dtypes (--mamba-cache-dtype, --mamba-ssm-cache-dtype; KvPlan::state): 2 x
// the state pool of `batch` slots; 0 for a model without such layers.
uint64_t decode_state_bytes(const ModelConfig& c, int batch, StateDtype conv_dtype, StateDtype ssm_dtype);

// K and V read by one decode step (full and sliding attention layers only); contexts[i] = tokens sequence i attends
// over in a full-attention layer (its length including the new token); the
// per-token-head dtypes' scales included.
uint64_t decode_kv_bytes(const ModelConfig& c, KvDtype d, std::span<const int> contexts);

}  // namespace fp8kv::bench
