#include "kv/block_pool.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fp8kv {

BlockPool::BlockPool(int64_t num_blocks) : num_blocks_(num_blocks) {
  if (num_blocks < 0 || num_blocks > INT32_MAX) throw std::invalid_argument("BlockPool: bad number of blocks");
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
  refs_.assign(static_cast<size_t>(num_blocks), 0);
  meta_.resize(static_cast<size_t>(num_blocks));
}

void BlockPool::check(int32_t b, const char* what) const {
  if (b < 0 || b >= num_blocks_ || refs_[b] == 0)
    throw std::logic_error(std::string("BlockPool: ") + what + " of block " + std::to_string(b) +
                           " that is not allocated");
}

int32_t BlockPool::allocate() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();  // evict the least recently freed cached block
    lru_.pop_front();
    unregister(b);
  } else {
    throw std::runtime_error("BlockPool: no free KV blocks");
  }
  refs_[b] = 1;
  return b;
}

void BlockPool::share(int32_t b) {
  check(b, "share");
  ++refs_[b];
}

void BlockPool::release(int32_t b) {
  check(b, "release");
  if (--refs_[b] > 0) return;
  Meta& m = meta_[b];
  if (m.cached) {
    lru_.push_back(b);
    m.lru_pos = std::prev(lru_.end());
  } else {
    free_.push_back(b);
  }
}

int BlockPool::ref_count(int32_t b) const {
  if (b < 0 || b >= num_blocks_) throw std::logic_error("BlockPool: ref_count of foreign block " + std::to_string(b));
  return refs_[b];
}

void BlockPool::register_block(int32_t b, int group, const BlockDigest& digest, const BlockDigest& parent,
                               std::span<const int> tokens) {
  check(b, "register");
  Meta& m = meta_[b];
  if (m.cached) return;
  const Key k{group, digest};
  if (index_.count(k)) return;
  m.cached = true;
  m.key = k;
  m.parent = parent;
  m.tokens.assign(tokens.begin(), tokens.end());
  index_.emplace(k, b);
}

int32_t BlockPool::lookup(int group, const BlockDigest& digest, const BlockDigest& parent,
                          std::span<const int> tokens) const {
  const auto it = index_.find(Key{group, digest});
  if (it == index_.end()) return -1;
  const Meta& m = meta_[it->second];
  // The guard: equal digests are not enough.
  if (m.parent != parent || !std::equal(m.tokens.begin(), m.tokens.end(), tokens.begin(), tokens.end())) return -1;
  return it->second;
}

void BlockPool::acquire(int32_t b) {
  if (b < 0 || b >= num_blocks_ || !meta_[b].cached)
    throw std::logic_error("BlockPool: acquire of block " + std::to_string(b) + " that is not cached");
  if (refs_[b] == 0) lru_.erase(meta_[b].lru_pos);
  ++refs_[b];
}

void BlockPool::unregister(int32_t b) {
  Meta& m = meta_[b];
  if (!m.cached) return;
  index_.erase(m.key);
  m.cached = false;
  m.tokens.clear();
  m.tokens.shrink_to_fit();
}

void BlockPool::reset_cache() {
  for (int32_t b : lru_) free_.push_back(b);
  lru_.clear();
  for (int32_t b = 0; b < num_blocks_; ++b) unregister(b);
}

}  // namespace fp8kv
