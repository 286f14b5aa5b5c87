// The per-sequence state pool of linear-attention (Gated DeltaNet) layers,
// beside the paged KV pool (docs/design.md "Paged KV cache and capacity"):
// one slot per running sequence, each slot holding, for every
// linear_attention layer, the conv state [C][K-1] and the recurrent state
// [Hv][Dk][Dv]. Its size does not depend on the context length: it comes out
// of the KV budget before the KV blocks are carved (plan_kv_cache), so the
// engine and `fp8kv capacity` count it the same way.
//
// With prefix caching on, a second pool of the same slots holds snapshots:
// a sequence's state copied at a snapshot boundary (every
// snapshot_interval blocks), which a prefix hit resumes from
// (docs/design.md "Prefix snapshots of the linear-attention state"). The
// backend allocates both pools as one array of total_slots() slots: running
// slots [0, num_slots), snapshot j at slot num_slots + j.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace fp8kv {

// Element types of the states, set by --mamba-cache-dtype (the conv state,
// bf16 by default) and --mamba-ssm-cache-dtype (the recurrent state, f32 by
// default; cli/engine_flags.h, docs/design.md "Qwen3.5 hybrids").
enum class StateDtype : uint8_t { f32, bf16 };
std::string_view state_dtype_name(StateDtype d);  // "float32" | "bfloat16"
inline uint64_t state_dtype_bytes(StateDtype d) { return d == StateDtype::f32 ? 4 : 2; }

struct StatePlan {
  std::vector<int> layers;  // the linear_attention layers, in model order (empty: no state pool)
  int num_slots = 0;        // max_num_seqs: a running sequence holds one slot
  // Per rank (the heads shard over tensor-parallel ranks).
  int64_t conv_dim = 0;     // C = 2 Hk Dk + Hv Dv
  int conv_width = 0;       // K - 1 inputs kept
  int num_k_heads = 0, num_v_heads = 0, k_head_dim = 0, v_head_dim = 0;
  StateDtype conv_dtype = StateDtype::bf16;
  StateDtype ssm_dtype = StateDtype::f32;

  // Prefix caching (0 / 0 when off): the snapshot pool and its boundaries.
  int64_t snapshot_slots = 0;
  int snapshot_interval = 0;  // blocks between snapshot boundaries

  bool empty() const { return layers.empty(); }
  bool snapshots() const { return snapshot_interval > 0; }
  int64_t total_slots() const { return num_slots + snapshot_slots; }
  int snapshot_slot(int64_t j) const { return static_cast<int>(num_slots + j); }  // backend slot of snapshot j
  uint64_t conv_bytes_per_layer() const;  // C x (K-1) x conv dtype bytes
  uint64_t ssm_bytes_per_layer() const;   // Hv x Dk x Dv x ssm dtype bytes
  uint64_t bytes_per_sequence() const;    // every layer's conv + recurrent state
  uint64_t pool_bytes() const;            // num_slots x bytes_per_sequence (the running sequences)
  uint64_t snapshot_pool_bytes() const;   // snapshot_slots x bytes_per_sequence
};

// The state plan of `cfg` (empty when it has no linear_attention layer).
// Throws InputError when tp does not divide the linear heads, or a size
// overflows 64 bits (naming the factors).
StatePlan plan_state(const ModelConfig& cfg, int max_num_seqs, int tensor_parallel_size, StateDtype conv_dtype,
                     StateDtype ssm_dtype);

}  // namespace fp8kv
