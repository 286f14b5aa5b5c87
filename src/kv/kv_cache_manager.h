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
//
// Prefix caching (docs/design.md "Prefix caching", off unless
// set_prefix_caching(true)): every full block whose K/V are computed is
// registered in the pool under the chain digest of its tokens, per group;
// find_cached_prefix() finds the longest run of leading full blocks a new
// sequence can reuse (vLLM's hybrid rule: full groups need every block of the
// run, sliding groups only those still inside the window of the next query),
// adopt_prefix() shares those pages into a fresh sequence. Shared pages are
// never written: a hit is whole blocks and new tokens go to new pages.
//
// State snapshots (models with linear_attention layers, kv/state_plan.h;
// docs/design.md "Prefix snapshots of the linear-attention state"): a hit
// must also resume the per-sequence state, which only exists where it was
// copied out. reserve_snapshot() gives a snapshot slot for a sequence whose
// step ends at a snapshot boundary (every plan.state.snapshot_interval
// blocks); cache_computed_blocks() ties it to the group-0 page of the block
// ending at the boundary, keyed by that block's chain digest. A hit is cut
// back to the longest boundary whose snapshot is still tied to the cached
// page there (an evicted page invalidates its snapshot). Snapshots are
// evicted least recently used first, stale ones before any other.
#pragma once
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <utility>
#include <span>
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

  // ---- prefix cache ----
  // Off by default; turning it off forgets every cached block.
  void set_prefix_caching(bool on);
  bool prefix_caching() const { return prefix_caching_; }
  struct PrefixHit {
    int tokens = 0;            // leading tokens whose K/V are cached (a multiple of block_size)
    int64_t pages_in_use = 0;  // of the pages of the hit, those other sequences hold (not taken from the free count)
    int state_slot = -1;       // with a state pool: the snapshot slot (backend slot) holding the state at `tokens`
  };
  // The longest reusable prefix of `tokens` (at most tokens.size() - 1: the
  // last token is always computed, so its logits exist). Zero when off.
  PrefixHit find_cached_prefix(std::span<const int> tokens) const;
  // Shares the cached pages of the first `num_tokens` tokens (a hit of
  // find_cached_prefix) into `seq`, which must be empty; num_tokens(seq)
  // becomes num_tokens.
  void adopt_prefix(int seq, std::span<const int> tokens, int num_tokens);
  // Registers the full blocks among the first `num_computed` tokens of `seq`
  // (tokens: the sequence's ids) not yet registered. No-op when off.
  void cache_computed_blocks(int seq, std::span<const int> tokens, int num_computed);
  // Forgets every cached block and state snapshot (the K/V they hold are
  // stale: new KV scales).
  void reset_prefix_cache();

  // ---- state snapshots ----
  // Prefix caching on a plan with a snapshot interval.
  bool snapshots_on() const { return prefix_caching_ && plan_.state.snapshots(); }
  // Tokens between snapshot boundaries (0 when snapshots are off).
  int snapshot_interval_tokens() const { return snapshots_on() ? plan_.state.snapshot_interval * plan_.block_size : 0; }
  // A snapshot of seq's state after its first `end` tokens (tokens: its ids;
  // end a snapshot boundary reached by this step): the backend slot the
  // runner copies the sequence's slot into after the step, committed by
  // cache_computed_blocks. -1 when none is needed (the boundary has a valid
  // snapshot already), snapshots are off, or every slot is reserved.
  int reserve_snapshot(int seq, std::span<const int> tokens, int end);
  int64_t num_snapshots() const { return static_cast<int64_t>(snap_index_.size()); }
  int64_t num_cached_blocks() const { return pool_.num_cached(); }
  const BlockPool& pool() const { return pool_; }
  // The digest of a block from its parent's digest and its tokens (SHA-256).
  using BlockHasher = BlockDigest (*)(const BlockDigest& parent, std::span<const int> tokens);
  static BlockDigest sha256_block_digest(const BlockDigest& parent, std::span<const int> tokens);
  // Tests: a weak hasher forces collisions (the guard compares tokens).
  void set_block_hasher_for_testing(BlockHasher h) { hasher_ = h; }

 private:
  struct Seq {
    bool live = false;
    int num_tokens = 0;
    std::vector<std::vector<int32_t>> tables;  // per group
    std::vector<BlockDigest> digests;          // chain digests of the leading full blocks registered so far
    std::vector<std::pair<int, int>> pending_snapshots;  // (boundary token, snapshot index) reserved this step
  };
  // Snapshot index j lives in backend slot plan.state.snapshot_slot(j).
  enum class SnapState : uint8_t { free, pending, valid };
  struct Snapshot {
    SnapState state = SnapState::free;
    BlockDigest digest{};  // chain digest of the block ending at the boundary
    int32_t page = -1;     // that block's group-0 page (the snapshot is valid while it holds the digest)
    std::list<int>::iterator lru_pos;
  };
  bool snapshot_valid(int j) const {
    const Snapshot& s = snaps_[static_cast<size_t>(j)];
    return s.state == SnapState::valid && pool_.holds(s.page, 0, s.digest);
  }
  void drop_snapshot(int j);  // a valid or pending snapshot back to free
  int take_snapshot_slot();   // a free index (evicting stale, then least recently used), or -1
  void commit_snapshots(Seq& s, std::span<const int> tokens);
  void reset_snapshots();
  std::vector<BlockDigest> chain_digests(std::span<const int> tokens, int num_blocks) const;

  // First logical block a query at position >= `next_pos` can still see.
  int first_live_block(int group, int next_pos) const;

  KvPlan plan_;
  KvCacheLayout layout_;
  BlockPool pool_;
  std::vector<int> layer_group_;
  std::vector<Seq> seqs_;
  std::vector<int> free_handles_;
  bool prefix_caching_ = false;
  BlockHasher hasher_ = &sha256_block_digest;
  std::vector<Snapshot> snaps_;          // [plan.state.snapshot_slots]
  std::vector<int> snap_free_;           // free indices, back() taken next
  std::list<int> snap_lru_;              // valid snapshots, front = least recently used
  std::map<BlockDigest, int> snap_index_;  // valid (or stale, until found) snapshots by digest
};

}  // namespace fp8kv
