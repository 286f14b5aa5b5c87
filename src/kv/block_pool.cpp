#include "kv/block_pool.h"

#include <stdexcept>
#include <string>

namespace fp8kv {

BlockPool::BlockPool(int64_t num_blocks) : num_blocks_(num_blocks) {
  if (num_blocks < 0 || num_blocks > INT32_MAX) throw std::invalid_argument("BlockPool: bad number of blocks");
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
  refs_.assign(static_cast<size_t>(num_blocks), 0);
}

void BlockPool::check(int32_t b, const char* what) const {
  if (b < 0 || b >= num_blocks_ || refs_[b] == 0)
    throw std::logic_error(std::string("BlockPool: ") + what + " of block " + std::to_string(b) +
                           " that is not allocated");
}

int32_t BlockPool::allocate() {
  if (free_.empty()) throw std::runtime_error("BlockPool: no free KV blocks");
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  return b;
}

void BlockPool::share(int32_t b) {
  check(b, "share");
  ++refs_[b];
}

void BlockPool::release(int32_t b) {
  check(b, "release");
  if (--refs_[b] == 0) free_.push_back(b);
}

int BlockPool::ref_count(int32_t b) const {
  if (b < 0 || b >= num_blocks_) throw std::logic_error("BlockPool: ref_count of foreign block " + std::to_string(b));
  return refs_[b];
}

}  // namespace fp8kv
