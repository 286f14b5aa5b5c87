#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include <openssl/evp.h>

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
    if (m.group[l] < 0 && std::find(plan.state.layers.begin(), plan.state.layers.end(), l) == plan.state.layers.end())
      throw std::logic_error("KvCacheManager: layer " + std::to_string(l) + " is in no KV group");
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
  if (plan.state.snapshots()) {
    snaps_.resize(static_cast<size_t>(plan.state.snapshot_slots));
    for (int j = static_cast<int>(plan.state.snapshot_slots); j-- > 0;) snap_free_.push_back(j);  // 0 first
  }
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
  for (const auto& [end, j] : s.pending_snapshots) drop_snapshot(j);  // its step never ran (an abort)
  s = Seq{};
  free_handles_.push_back(seq);
}

// ---- prefix cache ----

BlockDigest KvCacheManager::sha256_block_digest(const BlockDigest& parent, std::span<const int> tokens) {
  // parent digest, then the ids as little-endian int32 (the hosts we build for are little-endian).
  std::vector<unsigned char> buf(parent.size() + tokens.size() * sizeof(int32_t));
  std::memcpy(buf.data(), parent.data(), parent.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t v = tokens[i];
    std::memcpy(buf.data() + parent.size() + i * sizeof(int32_t), &v, sizeof v);
  }
  BlockDigest d{};
  unsigned int len = 0;
  if (EVP_Digest(buf.data(), buf.size(), d.data(), &len, EVP_sha256(), nullptr) != 1 || len != d.size())
    throw std::runtime_error("KvCacheManager: SHA-256 failed");
  return d;
}

void KvCacheManager::set_prefix_caching(bool on) {
  if (!on) reset_prefix_cache();
  prefix_caching_ = on;
}

void KvCacheManager::reset_prefix_cache() {
  pool_.reset_cache();
  reset_snapshots();
}

std::vector<BlockDigest> KvCacheManager::chain_digests(std::span<const int> tokens, int num_blocks) const {
  const int B = plan_.block_size;
  std::vector<BlockDigest> d(static_cast<size_t>(num_blocks));
  BlockDigest parent{};
  for (int i = 0; i < num_blocks; ++i) {
    d[i] = hasher_(parent, tokens.subspan(static_cast<size_t>(i) * B, B));
    parent = d[i];
  }
  return d;
}

KvCacheManager::PrefixHit KvCacheManager::find_cached_prefix(std::span<const int> tokens) const {
  PrefixHit hit;
  if (!prefix_caching_ || tokens.size() < 2) return hit;
  const int B = plan_.block_size;
  const int max_blocks = (static_cast<int>(tokens.size()) - 1) / B;  // the last token is always computed
  if (max_blocks == 0) return hit;
  const std::vector<BlockDigest> d = chain_digests(tokens, max_blocks);
  const int G = num_groups();
  auto page = [&](int g, int i) {
    const BlockDigest parent = i == 0 ? BlockDigest{} : d[i - 1];
    return pool_.lookup(g, d[i], parent, tokens.subspan(static_cast<size_t>(i) * B, B));
  };
  // Full-attention groups: the longest run of leading cached blocks.
  int L = max_blocks;
  for (int g = 0; g < G; ++g) {
    if (plan_.groups[g].window > 0) continue;
    int n = 0;
    while (n < L && page(g, n) >= 0) ++n;
    L = n;
  }
  // Sliding groups: the blocks in the window of the first new query must be
  // cached (older ones are not needed); shorten the run until they are.
  std::vector<std::vector<char>> cached(G);
  for (int g = 0; g < G; ++g) {
    if (plan_.groups[g].window <= 0) continue;
    cached[g].resize(L);
    for (int i = 0; i < L; ++i) cached[g][i] = page(g, i) >= 0;
  }
  for (; L > 0; --L) {
    bool ok = true;
    for (int g = 0; g < G && ok; ++g) {
      if (plan_.groups[g].window <= 0) continue;
      for (int i = first_live_block(g, L * B); i < L && ok; ++i) ok = cached[g][i];
    }
    if (ok) break;
  }
  // A state pool: the hit must end at a boundary whose snapshot is still
  // tied to the cached page there (the state after those tokens).
  if (!plan_.state.empty()) {
    int k = snapshots_on() ? L / plan_.state.snapshot_interval : 0;
    for (; k > 0; --k) {
      const int i = k * plan_.state.snapshot_interval - 1;
      const auto it = snap_index_.find(d[i]);
      if (it == snap_index_.end() || !snapshot_valid(it->second) || snaps_[it->second].page != page(0, i)) continue;
      hit.state_slot = plan_.state.snapshot_slot(it->second);
      break;
    }
    L = k * (snapshots_on() ? plan_.state.snapshot_interval : 0);
  }
  hit.tokens = L * B;
  for (int g = 0; g < G; ++g)
    for (int i = first_live_block(g, L * B); i < L; ++i) hit.pages_in_use += pool_.ref_count(page(g, i)) > 0;
  return hit;
}

void KvCacheManager::adopt_prefix(int seq, std::span<const int> tokens, int num_tokens) {
  Seq& s = seqs_.at(seq);
  const int B = plan_.block_size;
  if (!s.live || s.num_tokens != 0) throw std::logic_error("KvCacheManager::adopt_prefix: sequence is not empty");
  if (num_tokens % B != 0 || num_tokens >= static_cast<int>(tokens.size()))
    throw std::logic_error("KvCacheManager::adopt_prefix: not a whole-block prefix hit");
  const int L = num_tokens / B;
  s.digests = chain_digests(tokens, L);
  std::vector<std::vector<int32_t>> tables(plan_.groups.size());
  for (int g = 0; g < num_groups(); ++g) {
    tables[g].assign(static_cast<size_t>(L), -1);
    for (int i = first_live_block(g, num_tokens); i < L; ++i) {
      const BlockDigest parent = i == 0 ? BlockDigest{} : s.digests[i - 1];
      const int32_t p = pool_.lookup(g, s.digests[i], parent, tokens.subspan(static_cast<size_t>(i) * B, B));
      if (p < 0) throw std::logic_error("KvCacheManager::adopt_prefix: block is not cached");
      tables[g][i] = p;
    }
  }
  for (auto& t : tables)
    for (int32_t p : t)
      if (p >= 0) pool_.acquire(p);
  s.tables = std::move(tables);
  s.num_tokens = num_tokens;
  // The snapshot the hit resumes from was used now: last to be evicted.
  if (const auto it = L > 0 ? snap_index_.find(s.digests[L - 1]) : snap_index_.end(); it != snap_index_.end()) {
    Snapshot& sn = snaps_[it->second];
    if (sn.state == SnapState::valid) snap_lru_.splice(snap_lru_.end(), snap_lru_, sn.lru_pos);
  }
}

void KvCacheManager::cache_computed_blocks(int seq, std::span<const int> tokens, int num_computed) {
  if (!prefix_caching_) return;
  Seq& s = seqs_.at(seq);
  const int B = plan_.block_size;
  const int full = std::min(num_computed, s.num_tokens) / B;
  for (int i = static_cast<int>(s.digests.size()); i < full; ++i) {
    const BlockDigest parent = i == 0 ? BlockDigest{} : s.digests[i - 1];
    const std::span<const int> blk = tokens.subspan(static_cast<size_t>(i) * B, B);
    s.digests.push_back(hasher_(parent, blk));
    for (int g = 0; g < num_groups(); ++g) {
      const auto& t = s.tables[g];
      if (i < static_cast<int>(t.size()) && t[i] >= 0) pool_.register_block(t[i], g, s.digests[i], parent, blk);
    }
  }
  commit_snapshots(s, tokens);
}

// ---- state snapshots ----

void KvCacheManager::drop_snapshot(int j) {
  Snapshot& sn = snaps_[static_cast<size_t>(j)];
  if (sn.state == SnapState::free) return;
  if (sn.state == SnapState::valid) {
    snap_lru_.erase(sn.lru_pos);
    const auto it = snap_index_.find(sn.digest);
    if (it != snap_index_.end() && it->second == j) snap_index_.erase(it);
  }
  sn = Snapshot{};
  snap_free_.push_back(j);
}

int KvCacheManager::take_snapshot_slot() {
  if (snap_free_.empty()) {
    // Stale snapshots first (their page was evicted: no hit can reach them),
    // then the least recently used one.
    int victim = -1;
    for (int j : snap_lru_)
      if (!snapshot_valid(j)) {
        victim = j;
        break;
      }
    if (victim < 0 && !snap_lru_.empty()) victim = snap_lru_.front();
    if (victim < 0) return -1;  // every slot is reserved by this step
    drop_snapshot(victim);
  }
  const int j = snap_free_.back();
  snap_free_.pop_back();
  return j;
}

int KvCacheManager::reserve_snapshot(int seq, std::span<const int> tokens, int end) {
  const int every = snapshot_interval_tokens();
  if (every == 0 || end <= 0 || end % every != 0 || end > static_cast<int>(tokens.size())) return -1;
  Seq& s = seqs_.at(seq);
  const int B = plan_.block_size, last = end / B - 1;
  // The chain digest of the block ending at `end` (from the registered ones on).
  BlockDigest d = s.digests.empty() ? BlockDigest{} : s.digests.back();
  if (last < static_cast<int>(s.digests.size()))
    d = s.digests[static_cast<size_t>(last)];
  else
    for (int i = static_cast<int>(s.digests.size()); i <= last; ++i)
      d = hasher_(d, tokens.subspan(static_cast<size_t>(i) * B, B));
  if (const auto it = snap_index_.find(d); it != snap_index_.end()) {
    if (snapshot_valid(it->second)) return -1;  // another sequence saved this state already
    drop_snapshot(it->second);
  }
  for (const auto& [e, j] : s.pending_snapshots)
    if (e == end) return -1;
  const int j = take_snapshot_slot();
  if (j < 0) return -1;
  snaps_[static_cast<size_t>(j)].state = SnapState::pending;
  s.pending_snapshots.emplace_back(end, j);
  return plan_.state.snapshot_slot(j);
}

void KvCacheManager::commit_snapshots(Seq& s, std::span<const int> tokens) {
  const int B = plan_.block_size;
  auto& pend = s.pending_snapshots;
  for (auto p = pend.begin(); p != pend.end();) {
    const auto [end, j] = *p;
    const int i = end / B - 1;
    if (i >= static_cast<int>(s.digests.size())) {  // not computed yet: wait for its step
      ++p;
      continue;
    }
    p = pend.erase(p);
    Snapshot& sn = snaps_[static_cast<size_t>(j)];
    const BlockDigest parent = i == 0 ? BlockDigest{} : s.digests[static_cast<size_t>(i) - 1];
    const int32_t page = plan_.groups.empty() ? -1
                         : pool_.lookup(0, s.digests[static_cast<size_t>(i)], parent,
                                        tokens.subspan(static_cast<size_t>(i) * B, B));
    const auto it = snap_index_.find(s.digests[static_cast<size_t>(i)]);
    if (page < 0 || (it != snap_index_.end() && snapshot_valid(it->second))) {
      sn = Snapshot{};  // no block to tie it to, or saved twice in one step: the first stays
      snap_free_.push_back(j);
      continue;
    }
    if (it != snap_index_.end()) drop_snapshot(it->second);  // a stale one under the same digest
    sn.state = SnapState::valid;
    sn.digest = s.digests[static_cast<size_t>(i)];
    sn.page = page;
    sn.lru_pos = snap_lru_.insert(snap_lru_.end(), j);
    snap_index_[sn.digest] = j;
  }
}

void KvCacheManager::reset_snapshots() {
  for (auto& s : seqs_) s.pending_snapshots.clear();
  snap_lru_.clear();
  snap_index_.clear();
  snap_free_.clear();
  for (int j = static_cast<int>(snaps_.size()); j-- > 0;) {
    snaps_[static_cast<size_t>(j)] = Snapshot{};
    snap_free_.push_back(j);
  }
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
    // A shared page (another sequence or a prefix hit holds it) frees nothing.
    for (int b = 0; b < first && b < static_cast<int>(t.size()); ++b)
      if (t[b] >= 0 && pool_.ref_count(t[b]) == 1) ++released;
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
