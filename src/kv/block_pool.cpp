#include "kv/block_pool.h"

#include <stdexcept>
#include <string>

namespace fp8kv {

BlockPool::BlockPool(int64_t num_blocks) : num_blocks_(num_blocks) {
  if (num_blocks < 0 || num_blocks > INT32_MAX) throw std::invalid_argument("BlockPool: bad number of blocks");
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
  used_.assign(static_cast<size_t>(num_blocks), 0);
}

int32_t BlockPool::allocate() {
  if (free_.empty()) throw std::runtime_error("BlockPool: no free KV blocks");
  const int32_t b = free_.back();
  free_.pop_back();
  used_[b] = 1;
  return b;
}

void BlockPool::release(int32_t b) {
  if (b < 0 || b >= num_blocks_ || !used_[b])
    throw std::logic_error("BlockPool: release of block " + std::to_string(b) + " that is not allocated");
  used_[b] = 0;
  free_.push_back(b);
}

}  // namespace fp8kv
