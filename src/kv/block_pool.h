// A pool of equally sized KV pages (blocks), shared by every KV-cache group.
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
  // Throws std::logic_error on a double free or a foreign id.
  void release(int32_t block);

 private:
  int64_t num_blocks_;
  std::vector<int32_t> free_;  // stack: back() is allocated next
  std::vector<uint8_t> used_;
};

}  // namespace fp8kv
