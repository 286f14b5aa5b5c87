// KvCacheManager: pages per group, sliding-window recycling, accounting.
#include <gtest/gtest.h>

#include <set>

#include <nlohmann/json.hpp>

#include "kv/kv_cache_manager.h"
#include "kv/planner.h"

namespace fp8kv {
namespace {

ModelConfig hybrid_config(int window) {
  // qwen3 with mixed layer types: one full group and one sliding group.
  nlohmann::json j = {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"hidden_size", 64},
                      {"intermediate_size", 96}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"head_dim", 16}, {"vocab_size", 100},
                      {"max_position_embeddings", 256}, {"use_sliding_window", true}, {"sliding_window", window},
                      {"layer_types", {"full_attention", "sliding_attention"}}};
  return parse_model_config(j, "test");
}

KvPlan plan_for(const ModelConfig& c, int blocks_budget_tokens, int block_size = 4) {
  KvPlanSettings s;
  s.block_size = block_size;
  s.max_model_len = 64;
  s.max_num_batched_tokens = 16;
  s.max_num_seqs = 4;
  s.dtype = KvDtype::fp8_e4m3;
  s.kv_memory_bytes = kv_memory_needed(c, s) * static_cast<uint64_t>(blocks_budget_tokens);
  return plan_kv_cache(c, s);
}

int live_blocks(const std::vector<int32_t>& t) {
  int n = 0;
  for (int32_t b : t) n += b >= 0;
  return n;
}

TEST(KvCacheManager, FullGroupKeepsContextSlidingGroupRecycles) {
  const int W = 8, B = 4;
  const ModelConfig c = hybrid_config(W);
  const KvPlan plan = plan_for(c, 2, B);
  ASSERT_EQ(plan.groups.size(), 2u);
  KvCacheManager m(c, plan);
  const int full = m.group_of_layer(0), slid = m.group_of_layer(1);
  ASSERT_NE(full, slid);
  EXPECT_EQ(m.group_window(slid), W);
  const int s = m.add_sequence();
  const int64_t free0 = m.num_free_blocks();
  for (int pos = 0; pos < 60; ++pos) {
    m.append(s, 1);  // decode one token at a time
    EXPECT_EQ(m.num_tokens(s), pos + 1);
    const auto& tf = m.block_table(s, full);
    const auto& ts = m.block_table(s, slid);
    EXPECT_EQ(live_blocks(tf), pos / B + 1);
    // Queries at >= pos see keys > pos - W: blocks before (pos - W + 1) / B are gone.
    const int first_needed = std::max(0, pos - W + 1) / B;
    for (int b = 0; b < static_cast<int>(ts.size()); ++b) EXPECT_EQ(ts[b] >= 0, b >= first_needed) << pos << " " << b;
    // Every visible key still has a slot; slots are distinct across groups.
    std::set<int64_t> seen;
    for (int j = std::max(0, pos - W + 1); j <= pos; ++j) {
      EXPECT_TRUE(seen.insert(m.slot(s, slid, j)).second);
    }
    if (pos >= W + B - 1) {  // block 0 left the window: its slot is gone
      EXPECT_THROW(m.slot(s, slid, 0), std::logic_error);
    }
  }
  // Pages used = full context + at most window + block of the sliding group.
  EXPECT_LE(free0 - m.num_free_blocks(), (60 + B - 1) / B + (W + B - 1) / B + 1);
  m.free_sequence(s);
  EXPECT_EQ(m.num_free_blocks(), free0);
}

TEST(KvCacheManager, ChunkKeepsInFlightTokensAndRefusesWhenFull) {
  const ModelConfig c = hybrid_config(8);
  const KvPlan plan = plan_for(c, 1, 4);  // exactly one max-length request
  KvCacheManager m(c, plan);
  const int a = m.add_sequence();
  m.append(a, 16);  // one 16-token chunk: every token of it has a page in both groups
  for (int g = 0; g < m.num_groups(); ++g)
    for (int j = 0; j < 16; ++j) EXPECT_GE(m.slot(a, g, j), 0);
  // A second sequence of max length cannot fit beside the first.
  const int b = m.add_sequence();
  int appended = 0;
  while (m.can_append(b, 16) && appended < 64) {
    m.append(b, 16);
    appended += 16;
  }
  EXPECT_LT(appended, 64);
  const int64_t before = m.num_free_blocks();
  if (!m.can_append(b, 16)) {
    EXPECT_THROW(m.append(b, 16), std::runtime_error);
  }
  EXPECT_EQ(m.num_free_blocks(), before);  // a refused append changes nothing
  m.free_sequence(a);
  m.free_sequence(b);
  EXPECT_EQ(m.num_free_blocks(), plan.num_blocks);
}

// What admission reserves (blocks_to_hold): the whole prompt in a full
// group, the window plus one chunk in a sliding one (capped at the whole
// prompt). Hand arithmetic, and an upper bound that chunked prefill reaches.
TEST(KvCacheManager, BlocksToHoldIsTheWholePromptOrWindowPlusChunk) {
  const int W = 8, B = 4, L = 60, C = 16;
  const ModelConfig c = hybrid_config(W);
  const KvPlan plan = plan_for(c, 2, B);
  KvCacheManager m(c, plan);
  // full: ceil(60 / 4) = 15; sliding: min(15, ceil((8 - 1 + 16) / 4) + 1) = 7.
  EXPECT_EQ(m.blocks_to_hold(L, C), 15 + 7);
  EXPECT_EQ(m.blocks_to_hold(6, C), 2 + 2);  // a short prompt: the sliding group holds it whole too
  ASSERT_GE(plan.num_blocks, 22);
  const int s = m.add_sequence();
  int64_t most = 0;
  for (int done = 0; done < L; done += C) {
    m.append(s, std::min(C, L - done));
    most = std::max(most, m.blocks_held(s));
  }
  EXPECT_LE(most, m.blocks_to_hold(L, C));
  EXPECT_GE(most, 15 + 5);  // the full group's 15, and the sliding group's window of a chunk
  m.free_sequence(s);
  EXPECT_EQ(m.num_free_blocks(), plan.num_blocks);
}

// vLLM's hybrid rule (docs/design.md "Prefix caching"): a hit needs every
// block of the run in full-attention groups, but in sliding groups only the
// blocks still in the window of the first new query. A 41-token sequence is
// cached, then the oldest cached pages (its sliding group's first blocks,
// released first as the window moved) are evicted: the whole 40-token run
// still hits.
TEST(KvCacheManager, HybridPrefixHitNeedsOnlyTheSlidingWindowBlocks) {
  const int W = 8, B = 4;
  const ModelConfig c = hybrid_config(W);
  const KvPlan plan = plan_for(c, 2, B);
  KvCacheManager m(c, plan);
  m.set_prefix_caching(true);
  const int full = m.group_of_layer(0), slid = m.group_of_layer(1);
  std::vector<int> toks(41);
  for (int i = 0; i < 41; ++i) toks[i] = 3 + (i * 7) % 90;
  const int a = m.add_sequence();
  std::vector<int32_t> full_pages, slid_pages;  // logical block -> page, as first allocated
  for (int done = 0; done < 41; done += 4) {
    const int n = std::min(4, 41 - done);
    m.append(a, n);
    m.cache_computed_blocks(a, toks, done + n);
    for (auto [g, v] : {std::pair{full, &full_pages}, std::pair{slid, &slid_pages}}) {
      const auto& t = m.block_table(a, g);
      for (size_t b = v->size(); b < t.size(); ++b) v->push_back(t[b]);
    }
  }
  m.free_sequence(a);
  ASSERT_EQ(m.num_cached_blocks(), 2 * 10);  // 10 full blocks in each group
  EXPECT_EQ(m.find_cached_prefix(toks).tokens, 40);
  // Evict the e oldest cached pages: a sequence takes every plain free page
  // and e more (one-shot appends take a page per block in each group).
  const int64_t plain = m.num_free_blocks() - m.num_cached_blocks();
  const int64_t e = (plain + 8) % 2 == 0 ? 8 : 7;
  const int b = m.add_sequence();
  m.append(b, static_cast<int>(B * (plain + e) / 2));
  EXPECT_EQ(m.num_cached_blocks(), 20 - e);
  for (int i = 0; i < e; ++i) EXPECT_FALSE(m.pool().is_cached(slid_pages[i]) && m.pool().ref_count(slid_pages[i]) == 0) << i;
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(m.pool().is_cached(full_pages[i])) << i;
  // The first new query (position 40) sees keys 33..40: sliding blocks 8 and 9 (and 10, computed anew).
  for (int i = 8; i < 10; ++i) EXPECT_TRUE(m.pool().is_cached(slid_pages[i])) << i;
  EXPECT_EQ(m.find_cached_prefix(toks).tokens, 40);
  m.free_sequence(b);
  EXPECT_EQ(m.num_free_blocks(), plan.num_blocks);
}

TEST(KvCacheManager, StorageMatchesThePlan) {
  const ModelConfig c = hybrid_config(8);
  const KvPlan plan = plan_for(c, 3, 16);
  KvCacheManager m(c, plan);
  EXPECT_EQ(m.layout().num_blocks, plan.num_blocks);
  EXPECT_EQ(m.layout().block_size, 16);
  // group_size slots x (K, V) x num_blocks x layer block bytes == num_blocks x page_bytes.
  EXPECT_EQ(static_cast<uint64_t>(plan.group_size) * 2 * m.layout().cache_bytes(), plan.num_blocks * plan.page_bytes);
  // Layers in different groups at the same slot share storage; within a group
  // they do not. (The storage itself is the backend's: tests/engine
  // test_cpu_backend.cpp checks the pointers.)
  const KvLayerMap map = kv_layer_map(plan, c.num_layers);
  EXPECT_NE(map.group[0], map.group[1]);
  EXPECT_EQ(map.slot[0], map.slot[1]);
  for (int l = 0; l < c.num_layers; ++l)
    for (int j = l + 1; j < c.num_layers; ++j)
      if (map.group[l] == map.group[j]) {
        EXPECT_NE(map.slot[l], map.slot[j]) << l << " " << j;
      }
}

}  // namespace
}  // namespace fp8kv
