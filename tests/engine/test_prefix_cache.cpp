// Automatic prefix caching (docs/design.md "Prefix caching"): outputs with
// the cache on equal outputs with it off, bitwise (greedy tokens and
// logprobs), for full-attention and hybrid sliding-window models and for
// bf16 and fp8 caches; a shared prefix is not prefilled again; eviction under
// a full pool; preemption with shared blocks; every block back at the end.
//
// Why bitwise: on the CPU a token's K/V depend only on the tokens before it,
// and chunked prefill is bitwise equal to one-shot prefill and to decode
// (fixed reduction order per row, tests/engine/test_engine_reference.cpp).
// A prefix hit is a chunk boundary at a block edge: the reused pages hold the
// very bytes a recomputation would store, and the suffix rows attend to
// them in the same order. So there is no tolerance to derive: any difference
// is a bug. (On CUDA, where kernels may pick reduction orders per batch
// shape, equality would hold only to fp32 reordering.)
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "kv/kv_cache_manager.h"
#include "engine_fixtures.h"
#include "model/weights.h"
#include "reference.h"

namespace fp8kv {
namespace {

using testing::gen_request;
using testing::plan_for_requests;
using testing::random_tokens;
using testing::small_engine_options;
using testing::small_plan_settings;
using testing::tiny_config;
using testing::with_pool_for;
using Out = testing::RunOut;

// Each wave's prompts submitted at once and run until idle; waves in order.
std::vector<Out> run_waves(Engine& e, const std::vector<std::vector<std::vector<int>>>& waves, int max_tokens) {
  std::vector<Out> out;
  for (const auto& wave : waves)
    for (auto& o : testing::run_until_idle(e, wave, max_tokens)) out.push_back(std::move(o));
  return out;
}

EngineOptions small_options(const std::string& dtype, bool caching) {
  EngineOptions o = small_engine_options(dtype, 96, 32, 8);
  o.enable_prefix_caching = caching;
  return o;
}

struct Case {
  std::string family;
  std::string dtype;
};
std::string case_name(const ::testing::TestParamInfo<Case>& i) { return i.param.family + "_" + i.param.dtype; }

class PrefixCache : public ::testing::TestWithParam<Case> {};

// Prompts sharing a 41-token prefix (10 full blocks of 4 + 1), in waves: the
// later waves hit what the earlier ones cached, including blocks of
// generated tokens (a repeated prompt). On and off: identical tokens and
// logprobs, bit for bit.
TEST_P(PrefixCache, OnEqualsOffBitwise) {
  const ModelConfig cfg = tiny_config(GetParam().family);
  auto w = ModelWeights::random(cfg, 23, 0.15f, true);
  const std::vector<int> prefix = random_tokens(cfg, 41, 5);
  auto with = [&](int n, uint64_t seed) {
    std::vector<int> p = prefix;
    const auto s = random_tokens(cfg, n, seed);
    p.insert(p.end(), s.begin(), s.end());
    return p;
  };
  const std::vector<std::vector<std::vector<int>>> waves = {
      {with(3, 1)},
      {with(7, 2), with(1, 3), with(12, 4)},
      {with(3, 1), std::vector<int>(prefix.begin(), prefix.begin() + 16)},  // a repeat; a prompt inside the prefix
  };
  auto on = Engine::create(cfg, w, small_options(GetParam().dtype, true));
  auto off = Engine::create(cfg, w, small_options(GetParam().dtype, false));
  const auto a = run_waves(*on, waves, 12);
  const auto b = run_waves(*off, waves, 12);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "request " << i;
    EXPECT_EQ(a[i].logprobs, b[i].logprobs) << "request " << i;  // bitwise: see the file comment
    EXPECT_EQ(a[i].finish, FinishReason::length);
  }
  const PrefixCacheStats s_on = on->prefix_cache_stats(), s_off = off->prefix_cache_stats();
  EXPECT_GT(s_on.hits, 0);
  EXPECT_LT(s_on.computed_tokens, s_off.computed_tokens);
  EXPECT_EQ(s_on.computed_tokens + s_on.hits, s_off.computed_tokens);  // every hit token is one not computed
  EXPECT_EQ(s_off.hits, 0);
  EXPECT_EQ(s_off.queries, 0);
  EXPECT_EQ(on->free_kv_blocks(), on->kv_plan().num_blocks);  // cached but unreferenced pages are free
  EXPECT_EQ(off->free_kv_blocks(), off->kv_plan().num_blocks);
}

INSTANTIATE_TEST_SUITE_P(All, PrefixCache,
                         ::testing::Values(Case{"llama", "bf16"}, Case{"llama", "fp8_e4m3"}, Case{"qwen3", "bf16"},
                                           Case{"qwen3", "fp8_e4m3"}, Case{"gemma3", "bf16"},
                                           Case{"gemma3", "fp8_e5m2"}, Case{"llama", "int8_per_token_head"},
                                           Case{"gemma3", "fp8_per_token_head"}),
                         case_name);

// Two requests sharing a 64-token prefix, one after the other: the second
// prefills only its suffix (counted in tokens through the forward pass).
TEST(PrefixCacheCount, SecondRequestPrefillsOnlyTheSuffix) {
  for (const std::string family : {"llama", "qwen3"}) {
    SCOPED_TRACE(family);
    const ModelConfig cfg = tiny_config(family);
    auto w = ModelWeights::random(cfg, 3, 0.15f, true);
    auto e = Engine::create(cfg, w, small_options("fp8_e4m3", true));
    std::vector<int> a = random_tokens(cfg, 64, 9), b = a;
    const auto sa = random_tokens(cfg, 5, 10), sb = random_tokens(cfg, 7, 11);
    a.insert(a.end(), sa.begin(), sa.end());
    b.insert(b.end(), sb.begin(), sb.end());
    const int max_tokens = 4;
    run_waves(*e, {{a}}, max_tokens);
    const PrefixCacheStats s1 = e->prefix_cache_stats();
    EXPECT_EQ(s1.hits, 0);
    EXPECT_EQ(s1.queries, 69);
    EXPECT_EQ(s1.computed_tokens, 69 + max_tokens - 1);
    run_waves(*e, {{b}}, max_tokens);
    const PrefixCacheStats s2 = e->prefix_cache_stats();
    EXPECT_EQ(s2.hits - s1.hits, 64);
    EXPECT_EQ(s2.queries - s1.queries, 71);
    EXPECT_EQ(s2.computed_tokens - s1.computed_tokens, 7 + max_tokens - 1);  // the suffix + decodes
  }
}

// A pool of two full-length requests, then unrelated prompts that need
// more pages than the pool has: the first prompt's cached pages are evicted
// (LRU), nothing fails, and its repeat is recomputed (fewer hits than with a
// large pool, where the whole prompt but its last block hits), with the same
// tokens and logprobs as with caching off.
TEST(PrefixCacheEviction, FullPoolEvictsAndStaysCorrect) {
  const ModelConfig cfg = tiny_config("qwen3");
  auto w = ModelWeights::random(cfg, 31, 0.15f, true);
  auto opts = [&](bool caching, int requests) { return with_pool_for(small_options("bf16", caching), cfg, requests); };
  const std::vector<int> first = random_tokens(cfg, 60, 1);
  std::vector<std::vector<std::vector<int>>> waves = {{first}};
  for (int i = 0; i < 3; ++i) waves.push_back({random_tokens(cfg, 90, 100 + i)});
  waves.push_back({first});
  auto on = Engine::create(cfg, w, opts(true, 2));
  auto off = Engine::create(cfg, w, opts(false, 2));
  auto big = Engine::create(cfg, w, opts(true, 16));
  const auto a = run_waves(*on, waves, 4);
  const auto b = run_waves(*off, waves, 4);
  const auto c = run_waves(*big, waves, 4);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "request " << i;
    EXPECT_EQ(a[i].logprobs, b[i].logprobs) << "request " << i;
    EXPECT_EQ(c[i].tokens, b[i].tokens) << "request " << i;
  }
  // 3 x 90-token fillers need more pages than the small pool holds.
  const int64_t pool = on->kv_plan().num_blocks;
  EXPECT_GT(3 * ((90 + 4 + 3) / 4) * static_cast<int64_t>(on->kv_plan().groups.size()), pool);
  EXPECT_EQ(big->prefix_cache_stats().hits, 56);  // (60 - 1) / 4 whole blocks
  EXPECT_LT(on->prefix_cache_stats().hits, 56);   // evicted
  EXPECT_EQ(on->free_kv_blocks(), pool);
  EXPECT_LE(on->prefix_cache_stats().cached_blocks, pool);
}

// Preemption by recompute with shared pages: requests sharing a prefix in a
// pool too small for all; same greedy tokens as each alone without caching,
// every page back, every reference count zero.
TEST(PrefixCachePreemption, SharedBlocksSurviveRecompute) {
  const ModelConfig cfg = tiny_config("gemma3");
  auto w = ModelWeights::random(cfg, 41, 0.15f, true);
  const KvPlan plan = plan_for_requests(cfg, small_plan_settings(48, 16, KvDtype::fp8_e4m3), 2);
  KvCacheManager kv(cfg, plan);
  kv.set_prefix_caching(true);
  // Reference tokens: an engine without caching, each prompt alone.
  EngineOptions o = small_engine_options("fp8_e4m3", 48, 16);
  o.enable_prefix_caching = false;
  auto alone = Engine::create(cfg, w, o);
  const std::vector<int> prefix = random_tokens(cfg, 12, 77);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 5; ++i) {
    std::vector<int> p = prefix;
    const auto s = random_tokens(cfg, 1 + 2 * i, 200 + i);
    p.insert(p.end(), s.begin(), s.end());
    prompts.push_back(p);
  }
  // Through an engine with caching and the small pool.
  EngineOptions small = with_pool_for(o, cfg, 2);
  small.enable_prefix_caching = true;
  small.max_num_seqs = 8;
  auto e = Engine::create(cfg, w, small);
  const auto first = run_waves(*e, {{prompts[0]}}, 24);  // caches the prefix
  const auto together = run_waves(*e, {{prompts[1], prompts[2], prompts[3], prompts[4]}}, 24);
  EXPECT_GT(e->num_preemptions(), 0);
  EXPECT_GT(e->prefix_cache_stats().hits, 0);
  EXPECT_EQ(e->free_kv_blocks(), e->kv_plan().num_blocks);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto ref = run_waves(*alone, {{prompts[i]}}, 24);
    const Out& got = i == 0 ? first[0] : together[i - 1];
    EXPECT_EQ(got.tokens, ref[0].tokens) << "request " << i;
    EXPECT_EQ(got.logprobs, ref[0].logprobs) << "request " << i;
  }
}

// Scheduler level: shared pages are held by both sequences; at the end every
// reference count is zero and the pages stay cached (free).
TEST(PrefixCacheRefs, SharedPagesCountedAndAllReturned) {
  const ModelConfig cfg = tiny_config("llama");
  const KvPlan plan = plan_for_requests(cfg, small_plan_settings(64, 64), 4);
  KvCacheManager kv(cfg, plan);
  kv.set_prefix_caching(true);
  Scheduler sch(kv, SchedulerLimits{4, 64, plan.max_model_len}, {});
  auto req = [&](RequestId id, std::vector<int> p) { return gen_request(id, std::move(p), 8, 64); };
  const std::vector<int> p = random_tokens(cfg, 21, 3);  // 5 full blocks + 1 token
  sch.add(req(1, p));
  SchedulerOutput o = sch.schedule();
  sch.update(o, std::vector<int>{7});
  EXPECT_EQ(kv.num_cached_blocks(), 5 * kv.num_groups());
  sch.add(req(2, p));
  o = sch.schedule();
  ASSERT_EQ(o.seqs.size(), 2u);
  EXPECT_EQ(o.seqs[1].req->id, 2u);
  EXPECT_EQ(o.seqs[1].start, 20);  // 5 blocks reused
  EXPECT_EQ(o.seqs[1].num_tokens, 1);
  const SchedRequest& r2 = *o.seqs[1].req;
  for (int g = 0; g < kv.num_groups(); ++g)
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(kv.block_table(r2.kv, g)[i], kv.block_table(o.seqs[0].req->kv, g)[i]);
      EXPECT_EQ(kv.pool().ref_count(kv.block_table(r2.kv, g)[i]), 2);
    }
  sch.update(o, std::vector<int>{8, 8});
  while (!sch.idle()) {
    o = sch.schedule();
    sch.update(o, std::vector<int>(o.seqs.size(), 9));
  }
  EXPECT_EQ(kv.num_free_blocks(), plan.num_blocks);
  for (int32_t b = 0; b < plan.num_blocks; ++b) ASSERT_EQ(kv.pool().ref_count(b), 0) << "block " << b;
  EXPECT_GT(kv.num_cached_blocks(), 0);
  EXPECT_EQ(sch.prefix_cache_hits(), 20);
  EXPECT_EQ(sch.prefix_cache_queries(), 42);
}

// The collision guard: with a hasher that maps every block to one digest,
// a lookup must still compare tokens (and the parent) and miss on a
// different prompt; a genuine repeat still hits.
BlockDigest constant_hasher(const BlockDigest&, std::span<const int>) { return BlockDigest{}; }

TEST(PrefixCacheCollision, EqualDigestsDifferentTokensMiss) {
  const ModelConfig cfg = tiny_config("llama");
  const KvPlan plan = plan_for_requests(cfg, small_plan_settings(64, 64), 2);
  KvCacheManager kv(cfg, plan);
  kv.set_prefix_caching(true);
  kv.set_block_hasher_for_testing(&constant_hasher);
  const std::vector<int> a = random_tokens(cfg, 9, 1), b = random_tokens(cfg, 9, 2);
  const int seq = kv.add_sequence();
  kv.append(seq, 9);
  kv.cache_computed_blocks(seq, a, 9);
  EXPECT_EQ(kv.num_cached_blocks(), 1 * kv.num_groups());  // block 1 collides with block 0's key: not registered
  kv.free_sequence(seq);
  EXPECT_EQ(kv.find_cached_prefix(b).tokens, 0);
  EXPECT_EQ(kv.find_cached_prefix(a).tokens, 4);
  // Same first block, different second block: only the first hits.
  std::vector<int> c = a;
  c[5] = c[5] == 3 ? 4 : 3;
  EXPECT_EQ(kv.find_cached_prefix(c).tokens, 4);
}

TEST(PrefixCacheDigest, ChainsOverParentAndTokens) {
  const std::vector<int> t = {1, 2, 3, 4};
  const BlockDigest zero{};
  const BlockDigest d = KvCacheManager::sha256_block_digest(zero, t);
  EXPECT_NE(d, zero);
  EXPECT_EQ(d, KvCacheManager::sha256_block_digest(zero, t));
  EXPECT_NE(KvCacheManager::sha256_block_digest(d, t), d);
  const std::vector<int> u = {1, 2, 3, 5};
  EXPECT_NE(KvCacheManager::sha256_block_digest(zero, u), d);
}

}  // namespace
}  // namespace fp8kv

namespace fp8kv {
namespace {

// The cache's identity beyond the tokens (docs/design.md "Prefix caching"):
// dtype and block size are fixed for one engine, and new KV scales empty the
// cache, since the stored fp8 bytes depend on them. After set_kv_scales the
// same prompt gets no hit, and its tokens and logprobs equal a fresh engine
// that had those scales from the start (bitwise; see the file comment).
TEST(PrefixCacheScales, NewScalesEmptyTheCache) {
  const ModelConfig cfg = testing::tiny_config("llama");
  auto w = ModelWeights::random(cfg, 41, 0.15f, true);
  KvScales scales = KvScales::unity(cfg.num_layers);
  for (int l = 0; l < cfg.num_layers; ++l) {
    scales.layers[l].k.values = {0.05f + 0.01f * l};
    scales.layers[l].v.values = {0.03f};
  }
  const std::vector<int> prompt = testing::random_tokens(cfg, 41, 8);
  auto e = Engine::create(cfg, w, small_options("fp8_e4m3", true));
  run_waves(*e, {{prompt}}, 6);
  const PrefixCacheStats s1 = e->prefix_cache_stats();
  ASSERT_GT(s1.cached_blocks, 0);
  e->set_kv_scales(scales);
  EXPECT_EQ(e->prefix_cache_stats().cached_blocks, 0);
  const auto after = run_waves(*e, {{prompt}}, 6);
  EXPECT_EQ(e->prefix_cache_stats().hits, s1.hits) << "a page stored with the old scales was reused";

  auto fresh = Engine::create(cfg, w, small_options("fp8_e4m3", true));
  fresh->set_kv_scales(scales);
  const auto want = run_waves(*fresh, {{prompt}}, 6);
  EXPECT_EQ(after[0].tokens, want[0].tokens);
  EXPECT_EQ(after[0].logprobs, want[0].logprobs);
  // The same prompt again hits under the new scales, and stays exact.
  const auto again = run_waves(*e, {{prompt}}, 6);
  EXPECT_GT(e->prefix_cache_stats().hits, s1.hits);
  EXPECT_EQ(again[0].logprobs, want[0].logprobs);
}

}  // namespace
}  // namespace fp8kv
