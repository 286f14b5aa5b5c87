// A pool of equally sized KV pages (blocks), shared by every KV-cache group,
// with a reference count per block: allocate() hands out a block with count
// 1, share() adds a holder (another sequence, a prefix-cache hit), release()
// drops one; the block returns to the pool when its count reaches 0.
//
// Prefix cache (docs/design.md "Prefix caching"): a full block whose K/V are
// computed can be registered under a key (its KV group and the chain digest
// of the tokens up to and including the block), with the digest of its parent
// block and its own token ids (the collision guard: a lookup must match all
// three, not only the key). A registered block that reaches count 0 stays
// cached in an LRU list of free blocks: lookup() + acquire() take it back
// without recomputation; allocate() evicts it (least recently freed first)
// only when no never-registered free block is left. num_free() counts both.
//
// Allocation order is deterministic (lowest free id first after a reset,
// then most recently freed first), so runs are reproducible; with nothing
// registered the pool behaves exactly as without a prefix cache.
#pragma once
#include <array>
#include <cstdint>
#include <list>
#include <map>
#include <span>
#include <vector>

namespace fp8kv {

// SHA-256 of (parent digest, token ids): the chain digest of a full block.
using BlockDigest = std::array<uint8_t, 32>;

class BlockPool {
 public:
  explicit BlockPool(int64_t num_blocks);
  int64_t num_blocks() const { return num_blocks_; }
  // Free blocks: never registered, plus cached ones nobody holds (evictable).
  int64_t num_free() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  // Throws std::runtime_error when empty (callers check num_free first).
  // Evicts the least recently freed cached block when no plain free block is left.
  int32_t allocate();
  // One more holder of an allocated block. Throws std::logic_error when the
  // block is not allocated.
  void share(int32_t block);
  // Drops one holder; the block is free again when none is left. Throws
  // std::logic_error on a double free or a foreign id.
  void release(int32_t block);
  // Holders of a block (0: free). Throws std::logic_error on a foreign id.
  int ref_count(int32_t block) const;

  // ---- prefix cache ----
  // Registers an allocated block under (group, digest). No-op when the key
  // already names a block (two sequences computed the same prefix: the first
  // one stays) or the block is registered already.
  void register_block(int32_t block, int group, const BlockDigest& digest, const BlockDigest& parent,
                      std::span<const int> tokens);
  // The block registered under (group, digest) whose parent digest and
  // tokens are also equal; -1 when none.
  int32_t lookup(int group, const BlockDigest& digest, const BlockDigest& parent, std::span<const int> tokens) const;
  // A holder for a looked-up block: takes it out of the LRU list when free.
  void acquire(int32_t block);
  // Forgets every registration (cached free blocks become plain free ones):
  // the cached K/V no longer match (e.g. new KV scales).
  void reset_cache();
  int64_t num_cached() const { return static_cast<int64_t>(index_.size()); }
  bool is_cached(int32_t block) const { return meta_.at(static_cast<size_t>(block)).cached; }
  // The block is registered under (group, digest) now (false once evicted
  // or registered anew): what keeps a state snapshot tied to its block.
  bool holds(int32_t block, int group, const BlockDigest& digest) const {
    const Meta& m = meta_.at(static_cast<size_t>(block));
    return m.cached && m.key.group == group && m.key.digest == digest;
  }

 private:
  struct Key {
    int group;
    BlockDigest digest;
    bool operator<(const Key& o) const { return group != o.group ? group < o.group : digest < o.digest; }
  };
  struct Meta {
    bool cached = false;
    Key key{};
    BlockDigest parent{};
    std::vector<int> tokens;
    std::list<int32_t>::iterator lru_pos;  // valid when cached and free
  };
  void check(int32_t block, const char* what) const;
  void unregister(int32_t block);
  int64_t num_blocks_;
  std::vector<int32_t> free_;  // never-registered free blocks, a stack: back() is allocated next
  std::list<int32_t> lru_;     // cached free blocks, front = least recently freed (evicted first)
  std::vector<int32_t> refs_;  // [num_blocks] holders per block
  std::vector<Meta> meta_;     // [num_blocks]
  std::map<Key, int32_t> index_;
};

}  // namespace fp8kv
