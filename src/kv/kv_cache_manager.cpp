#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fp8kv {

KvLayerMap kv_layer_map(const KvPlan& plan, int num_layers) {
  KvLayerMap m;
  m.group.assign(num_layers, -1);
  m.slot.assign(num_layers, -1);
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const auto& layers = plan.groups[g].layers;
    for (size_t i = 0; i < layers.size(); ++i) {
      const int l = layers[i];
      if (l < 0 || l >= num_layers) continue;  // padding
      m.group[l] = static_cast<int>(g);
      m.slot[l] = static_cast<int>(i);
    }
  }
  for (int l = 0; l < num_layers; ++l)
    if (m.group[l] < 0) throw std::logic_error("KvCacheManager: layer " + std::to_string(l) + " is in no KV group");
  return m;
}

KvCacheLayout kv_layout(const KvPlan& plan) {
  KvCacheLayout l;
  l.num_blocks = static_cast<int>(plan.num_blocks);
  l.block_size = plan.block_size;
  l.num_kv_heads = plan.kv_heads_per_rank;
  l.head_dim = plan.head_dim;
  l.dtype = plan.dtype;
  return l;
}

KvCacheManager::KvCacheManager(const ModelConfig& cfg, const KvPlan& plan)
    : plan_(plan), layout_(kv_layout(plan)), pool_(plan.num_blocks) {
  layer_group_ = kv_layer_map(plan, cfg.num_layers).group;
}

int64_t KvCacheManager::blocks_to_hold(int num_tokens, int chunk) const {
  const int64_t B = plan_.block_size;
  const int64_t whole = (num_tokens + B - 1) / B;
  int64_t total = 0;
  for (const auto& g : plan_.groups) {
    if (g.window <= 0) {
      total += whole;
    } else {
      const int64_t in_flight = g.window - 1 + std::max(1, chunk);
      total += std::min(whole, (in_flight + B - 1) / B + 1);
    }
  }
  return total;
}

int KvCacheManager::add_sequence() {
  int h;
  if (!free_handles_.empty()) {
    h = free_handles_.back();
    free_handles_.pop_back();
  } else {
    h = static_cast<int>(seqs_.size());
    seqs_.emplace_back();
  }
  Seq& s = seqs_[h];
  s.live = true;
  s.num_tokens = 0;
  s.tables.assign(plan_.groups.size(), {});
  return h;
}

void KvCacheManager::free_sequence(int seq) {
  Seq& s = seqs_.at(seq);
  if (!s.live) throw std::logic_error("KvCacheManager: free of a dead sequence");
  // Release in reverse order so a fresh sequence gets the same pages back.
  for (auto it = s.tables.rbegin(); it != s.tables.rend(); ++it)
    for (auto b = it->rbegin(); b != it->rend(); ++b)
      if (*b >= 0) pool_.release(*b);
  s = Seq{};
  free_handles_.push_back(seq);
}

int KvCacheManager::first_live_block(int group, int next_pos) const {
  const int w = plan_.groups[group].window;
  if (w <= 0) return 0;
  // Queries at positions >= next_pos see keys j > next_pos - w.
  const int first_key = std::max(0, next_pos - w + 1);
  return first_key / plan_.block_size;
}

int64_t KvCacheManager::blocks_held(int seq) const {
  int64_t n = 0;
  for (const auto& t : seqs_.at(seq).tables)
    for (int32_t b : t) n += b >= 0;
  return n;
}

int64_t KvCacheManager::blocks_needed(int seq, int n) const {
  const Seq& s = seqs_.at(seq);
  const int B = plan_.block_size;
  const int new_total = s.num_tokens + n;
  const int64_t need_logical = (new_total + B - 1) / B;
  int64_t need = 0, released = 0;
  for (size_t g = 0; g < plan_.groups.size(); ++g) {
    const auto& t = s.tables[g];
    need += std::max<int64_t>(0, need_logical - static_cast<int64_t>(t.size()));
    const int first = first_live_block(static_cast<int>(g), s.num_tokens);
    for (int b = 0; b < first && b < static_cast<int>(t.size()); ++b)
      if (t[b] >= 0) ++released;
  }
  // Out-of-window pages are released before new ones are taken.
  return std::max<int64_t>(0, need - released);
}

void KvCacheManager::append(int seq, int n) {
  if (n < 0) throw std::invalid_argument("KvCacheManager::append: negative count");
  if (!can_append(seq, n))
    throw std::runtime_error("KV cache full: " + std::to_string(blocks_needed(seq, n)) + " blocks needed, " +
                             std::to_string(pool_.num_free()) + " free");
  Seq& s = seqs_[seq];
  const int B = plan_.block_size;
  for (size_t g = 0; g < plan_.groups.size(); ++g) {
    auto& t = s.tables[g];
    const int first = first_live_block(static_cast<int>(g), s.num_tokens);
    for (int b = 0; b < first && b < static_cast<int>(t.size()); ++b) {
      if (t[b] >= 0) {
        pool_.release(t[b]);
        t[b] = -1;
      }
    }
  }
  const size_t need_logical = static_cast<size_t>((s.num_tokens + n + B - 1) / B);
  for (auto& t : s.tables)
    while (t.size() < need_logical) t.push_back(pool_.allocate());
  s.num_tokens += n;
}

int64_t KvCacheManager::slot(int seq, int group, int pos) const {
  const auto& t = seqs_[seq].tables[group];
  const int B = plan_.block_size;
  const int32_t page = t.at(static_cast<size_t>(pos / B));
  if (page < 0) throw std::logic_error("KvCacheManager::slot: position outside the window");
  return static_cast<int64_t>(page) * B + pos % B;
}

}  // namespace fp8kv
