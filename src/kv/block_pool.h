// A pool of equally sized KV pages (blocks), shared by every KV-cache group,
// with a reference count per block: allocate() hands out a block with count
// 1, share() adds a holder (a prefix cache, a forked sequence), release()
// drops one; the block returns to the pool when its count reaches 0.
// Allocation order is deterministic (lowest free id first after a reset,
// then most recently freed first), so runs are reproducible.
#pragma once
#include <cstdint>
#include <vector>

namespace fp8kv {

class BlockPool {
 public:
  explicit BlockPool(int64_t num_blocks);
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  // Throws std::runtime_error when empty (callers check num_free first).
  int32_t allocate();
  // One more holder of an allocated block. Throws std::logic_error when the
  // block is not allocated.
  void share(int32_t block);
  // Drops one holder; the block is free again when none is left. Throws
  // std::logic_error on a double free or a foreign id.
  void release(int32_t block);
  // Holders of a block (0: free). Throws std::logic_error on a foreign id.
  int ref_count(int32_t block) const;

 private:
  void check(int32_t block, const char* what) const;
  int64_t num_blocks_;
  std::vector<int32_t> free_;  // stack: back() is allocated next
  std::vector<int32_t> refs_;  // [num_blocks] holders per block
};

}  // namespace fp8kv
