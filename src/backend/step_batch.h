// StepBatch: everything one forward step needs to know about the sequences
// it runs, built on the host by the ModelRunner (engine/model_runner.h) and
// handed to the backend once per step (Backend::begin_step), which uploads it
// (CUDA) or keeps a pointer (CPU). Layout follows vLLM's attention metadata.
//
// T = num_tokens (new tokens this step, all sequences concatenated),
// S = num_seqs, G = num_groups (KV-cache groups of the plan, kv/planner.h),
// B = max_blocks_per_seq.
//
// Ordering: decodes first. Sequences [0, num_decodes) have exactly one query
// token (is_decode = 1); the rest are prefill chunks (one or more tokens,
// is_decode = 0). A sequence's query rows are [query_start[s],
// query_start[s+1]) at positions [context_lens[s] - n, context_lens[s]),
// n = query_start[s+1] - query_start[s]; their K/V are stored (store_kv)
// before attention reads them.
#pragma once
#include <cstdint>
#include <vector>

namespace fp8kv {

// Per-row sampling parameters for Backend::sample (device sampling).
struct RowSampling {
  float temperature = 0.0f;  // 0: greedy (argmax, ties -> lowest id)
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0: off
  uint64_t seed = 0;         // request seed
  uint64_t counter = 0;      // tokens this request has sampled so far (stream position)
};

struct StepBatch {
  int num_tokens = 0;       // T
  int num_seqs = 0;         // S
  int num_decodes = 0;      // sequences [0, num_decodes) are decodes (query length 1)
  int max_query_len = 0;    // max over s of query length
  int max_context_len = 0;  // max over s of context_lens[s]
  int num_groups = 0;       // G
  int max_blocks_per_seq = 0;  // B: columns of every packed block table
  // Context length the decode attention plan (split size) is made for; 0:
  // the longest decode context of this step. A step padded for a CUDA graph
  // sets max_model_len, so the captured plan covers every replayed context
  // (engine/model_runner.h). Padding sequences have context_lens 0.
  int decode_plan_context = 0;

  std::vector<int32_t> token_ids;     // [T] input ids
  std::vector<int32_t> positions;     // [T] absolute position of each token
  std::vector<int32_t> query_start;   // [S + 1] row offsets into the T tokens; query_start[0] = 0
  std::vector<int32_t> context_lens;  // [S] keys in the cache after this step's store
  std::vector<uint8_t> is_decode;     // [S] 1 for s < num_decodes
  // Per KV-cache group g: slot (page * block_size + offset) of every token,
  // -1 to skip the store of that token.
  std::vector<std::vector<int64_t>> slot_mapping;  // [G][T]
  // Per group: block tables packed row-major [S][B] (logical block ->
  // physical page). -1 pads the rows and marks pages a sliding-window group
  // has released; attention never reads those.
  std::vector<std::vector<int32_t>> block_tables;  // [G][S * B]
  // Sampling inside the step (Backend::samples_in_step; empty: none): rows
  // of the step's hidden states to sample and their parameters [n] each.
  // Not sent to tensor-parallel followers (the runner samples in the step
  // only on one rank).
  std::vector<int32_t> sample_rows;
  std::vector<RowSampling> sample_params;
  // Linear-attention models (kv/state_plan.h; empty otherwise): each
  // sequence's slot in the state pool [S] (the KV sequence handle).
  std::vector<int32_t> state_slots;

  int query_len(int s) const { return query_start[s + 1] - query_start[s]; }
  const int32_t* block_table(int group, int s) const {
    return block_tables[group].data() + static_cast<int64_t>(s) * max_blocks_per_seq;
  }
};

}  // namespace fp8kv
