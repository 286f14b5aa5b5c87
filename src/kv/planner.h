// KV capacity planning: ONE function sizes the pool for both the engine's
// allocator and `fp8kv capacity` (DESIGN.md), following vLLM's hybrid
// allocator: layers are split into KV-cache groups of equal layer count
// (one attention type per group: full, or one sliding window); all groups
// draw equally sized pages from one pool. A page (one "block") holds
// block_size tokens of K and V for every layer of a group.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "numerics/fp8.h"

namespace fp8kv {

struct KvPlanSettings {
  uint64_t kv_memory_bytes = 0;     // budget for the KV cache itself, per rank
  int max_model_len = 0;            // 0: the model's max_position_embeddings
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;  // also the in-flight tokens a sliding layer must keep
  int block_size = 16;
  KvDtype dtype = KvDtype::bf16;
  int tensor_parallel_size = 1;
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
};

// Throws InputError (with what would fit) on bad settings or when memory is
// too small for one sequence of max_model_len.
KvPlan plan_kv_cache(const ModelConfig& cfg, const KvPlanSettings& s);

// "80GiB", "512MiB" (binary), "80GB" (decimal), plain bytes. Throws InputError.
uint64_t parse_size(const std::string& s);

}  // namespace fp8kv
