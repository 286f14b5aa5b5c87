// The paged KV cache bookkeeping of one model: the block pool and the block
// tables of the live sequences. The storage itself belongs to the backend
// (Backend::allocate_kv, backend/backend.h); kv_layer_map() says which
// tensor each layer uses.
//
// Storage (docs/design.md "Paged KV cache and capacity", planner.h): the plan splits layers into KV-cache groups
// of group_size layers each (one attention type per group). Layer slot i of
// every group shares one K and one V tensor of
// [num_blocks][block_size][num_kv_heads][head_dim] (KvCacheLayout): a page
// (block id b) given to group g holds block b of slot i for each layer i of
// g. Memory = num_blocks x page_bytes, exactly what the planner counted.
//
// Each sequence owns one block table per group (logical block -> page).
// Full-attention groups keep the whole context; sliding-window groups
// (key j visible from query i iff i - j < window) release pages whose every
// token has left the window of all future queries, leaving -1 in the table.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/block_pool.h"
#include "kv/layout.h"
#include "kv/planner.h"
#include "model/config.h"

namespace fp8kv {

// Which storage tensor a layer uses: group[l] (its KV-cache group) and
// slot[l] (its index within the group; layers with the same slot share one K
// and one V tensor of kv_layout(plan)).
struct KvLayerMap {
  std::vector<int> group;  // [num_layers]
  std::vector<int> slot;   // [num_layers]
};
// Throws std::logic_error when a layer is in no group.
KvLayerMap kv_layer_map(const KvPlan& plan, int num_layers);
// The layout of every storage tensor: [plan.num_blocks][block_size][kv heads per rank][head_dim].
KvCacheLayout kv_layout(const KvPlan& plan);

class KvCacheManager {
 public:
  KvCacheManager(const ModelConfig& cfg, const KvPlan& plan);

  const KvCacheLayout& layout() const { return layout_; }
  const KvPlan& plan() const { return plan_; }
  int num_groups() const { return static_cast<int>(plan_.groups.size()); }
  int group_of_layer(int layer) const { return layer_group_[layer]; }
  int group_window(int group) const { return plan_.groups[group].window; }
  // Blocks a sequence of num_tokens holds at most while it is prefilled in
  // chunks of at most `chunk` tokens (full groups: the whole sequence;
  // sliding groups: window + one chunk). Admission reserves this much.
  int64_t blocks_to_hold(int num_tokens, int chunk) const;
  int64_t num_total_blocks() const { return pool_.num_blocks(); }

  // ---- sequences ----
  int add_sequence();  // returns a sequence handle
  void free_sequence(int seq);
  int num_tokens(int seq) const { return seqs_[seq].num_tokens; }
  // Pages the sequence holds now (all groups).
  int64_t blocks_held(int seq) const;
  // Pages needed to extend `seq` by n tokens (after releasing pages that left
  // the window of sliding groups).
  int64_t blocks_needed(int seq, int n) const;
  bool can_append(int seq, int n) const { return blocks_needed(seq, n) <= pool_.num_free(); }
  // Releases out-of-window pages, then allocates pages for tokens
  // [num_tokens, num_tokens + n). Throws std::runtime_error when the pool is
  // short (nothing changes then).
  void append(int seq, int n);
  const std::vector<int32_t>& block_table(int seq, int group) const { return seqs_[seq].tables[group]; }
  // Slot (page * block_size + offset) of the token at `pos` in `group`.
  int64_t slot(int seq, int group, int pos) const;
  int64_t num_free_blocks() const { return pool_.num_free(); }

 private:
  struct Seq {
    bool live = false;
    int num_tokens = 0;
    std::vector<std::vector<int32_t>> tables;  // per group
  };
  // First logical block a query at position >= `next_pos` can still see.
  int first_live_block(int group, int next_pos) const;

  KvPlan plan_;
  KvCacheLayout layout_;
  BlockPool pool_;
  std::vector<int> layer_group_;
  std::vector<Seq> seqs_;
  std::vector<int> free_handles_;
};

}  // namespace fp8kv
