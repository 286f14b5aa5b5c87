// Prefix caching on a tiny random Qwen3.5 model (Gated DeltaNet layers +
// gated full attention), through its state snapshots (docs/design.md "Prefix
// snapshots of the linear-attention state"): outputs with the cache on equal
// outputs with it off, a hit prefills only the suffix after the longest
// snapshotted boundary, a snapshot pool too small for everything stays
// correct, preemption keeps the snapshots, and the scheduler's restores and
// saves name the right slots.
//
// The tolerance. Snapshot boundaries at multiples of 64 tokens (the
// automatic interval always is one; here 16 blocks of 4): the CPU engine's
// outputs are then bitwise those of the cache off. A token's K/V and every
// GEMM row depend only on the tokens before it (tests/engine/
// test_prefix_cache.cpp), the conv inputs are rounded to the state dtype
// before the conv reads them in any chunking (backend/cpu/gdn.h), and the
// chunked delta rule works in chunks aligned to absolute multiples of 64, so
// a prefill split at a boundary -- the one the cache cuts, and the one a hit
// resumes at -- gives the one-shot bits (test_qwen3_5.cpp checks that
// split). The state a hit restores is a byte copy of the one the same split
// left. So no tolerance: any difference is a bug (the prompts here leave
// more than one token after each boundary: a one-token chunk would run the
// recurrent form, decode's). Boundaries elsewhere
// (--state-snapshot-interval 3 with blocks of 4: every 12 tokens) split the
// delta rule's chunks: the sums reassociate in fp32, within the 1e-3 logprob
// bound test_qwen3_5.cpp derives for unaligned chunked prefill.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine_fixtures.h"
#include "io/errors.h"
#include "kv/kv_cache_manager.h"
#include "kv/planner.h"
#include "model/config.h"
#include "model/weights.h"

namespace fp8kv {
namespace {

using Out = testing::RunOut;

ModelConfig tiny_qwen3_5() { return testing::tiny_qwen3_5_config(); }

std::vector<int> random_tokens(int n, uint64_t seed) { return testing::random_tokens(tiny_qwen3_5(), n, seed); }

std::vector<int> concat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

constexpr int kBlock = 4;
constexpr int kInterval = 16;  // blocks: a boundary every 64 tokens

EngineOptions opts(bool caching, int interval = kInterval) {
  EngineOptions o;
  o.backend = BackendChoice::cpu;
  o.kv_cache_dtype = "bf16";
  o.block_size = kBlock;
  o.max_model_len = 256;
  o.max_num_batched_tokens = 256;
  o.max_num_seqs = 8;
  o.kv_memory_bytes = 8u << 20;
  o.enable_prefix_caching = caching;
  o.state_snapshot_interval = interval;
  return o;
}

// The plan settings of o's shape (block size, lengths, batch), for sizing
// o.kv_memory_bytes from kv_memory_needed.
KvPlanSettings shape_settings(const EngineOptions& o) {
  KvPlanSettings s;
  s.block_size = o.block_size;
  s.max_model_len = o.max_model_len;
  s.max_num_seqs = o.max_num_seqs;
  s.max_num_batched_tokens = o.max_num_batched_tokens;
  return s;
}

struct Fixture {
  ModelConfig cfg = tiny_qwen3_5();
  std::shared_ptr<const ModelWeights> w = ModelWeights::random(cfg, 42, 0.15f, /*bf16=*/true);
  std::unique_ptr<Engine> make(const EngineOptions& o) { return Engine::create(cfg, w, o); }
};

// Each wave's prompts submitted at once and run until idle; waves in order.
std::vector<Out> run_prefix_waves(Engine& e, const std::vector<std::vector<std::vector<int>>>& waves, int max_tokens) {
  std::vector<Out> out;
  for (const auto& wave : waves)
    for (auto& o : testing::run_until_idle(e, wave, max_tokens)) out.push_back(std::move(o));
  return out;
}

TEST(Qwen3_5Prefix, PlanHasSnapshotsAndTheKvLineShowsThem) {
  Fixture f;
  auto on = f.make(opts(true));
  auto off = f.make(opts(false));
  const KvPlan& p = on->kv_plan();
  EXPECT_EQ(p.state.snapshot_interval, kInterval);
  EXPECT_GT(p.state.snapshot_slots, 0);
  EXPECT_TRUE(p.prefix_caching_off_reason.empty());
  // The snapshots share the budget: fewer KV blocks than with caching off.
  EXPECT_EQ(off->kv_plan().state.snapshot_slots, 0);
  EXPECT_LT(p.num_blocks, off->kv_plan().num_blocks);
  EXPECT_LE(p.pool_bytes() + p.state.pool_bytes() + p.state.snapshot_pool_bytes(), 8u << 20);
  EXPECT_GE(p.state.snapshot_slots, p.num_blocks / kInterval);
  EXPECT_NE(kv_plan_log_line(p).find("state snapshots (prefix caching): every 16 blocks (64 tokens"),
            std::string::npos)
      << kv_plan_log_line(p);
}

// Shared prefixes shorter than a boundary, exactly at one, past one and past
// two; two prompts sharing a prefix in one wave; repeated identical prompts.
TEST(Qwen3_5Prefix, OnEqualsOffBitwiseAndHitsEndAtSnapshots) {
  Fixture f;
  const auto base = random_tokens(200, 11);
  auto pre = [&](int n) { return std::vector<int>(base.begin(), base.begin() + n); };
  struct Case {
    int shared;       // tokens the two prompts share
    int expect_hit;   // tokens the second prompt reuses: the last boundary <= shared
  };
  for (const Case c : {Case{40, 0}, Case{64, 64}, Case{100, 64}, Case{140, 128}}) {
    const auto a = concat(pre(c.shared), random_tokens(21, 100 + c.shared));
    const auto b = concat(pre(c.shared), random_tokens(9, 200 + c.shared));
    const std::vector<std::vector<std::vector<int>>> waves = {{a}, {b}};
    const int max_tokens = 6;
    auto on = f.make(opts(true));
    auto off = f.make(opts(false));
    const auto x = run_prefix_waves(*on, waves, max_tokens);
    const auto y = run_prefix_waves(*off, waves, max_tokens);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i].tokens, y[i].tokens) << "shared " << c.shared << " request " << i;
      EXPECT_EQ(x[i].logprobs, y[i].logprobs) << "shared " << c.shared << " request " << i;  // bitwise
    }
    const PrefixCacheStats s = on->prefix_cache_stats(), t = off->prefix_cache_stats();
    EXPECT_EQ(s.hits, c.expect_hit) << "shared " << c.shared;
    // A hit prefills only the suffix: every hit token is one not computed.
    EXPECT_EQ(s.computed_tokens + s.hits, t.computed_tokens) << "shared " << c.shared;
    EXPECT_EQ(s.computed_tokens,
              static_cast<int64_t>(a.size() + b.size()) - c.expect_hit + 2 * (max_tokens - 1));
  }
  // Two prompts sharing 130 tokens in one wave (the second admitted beside
  // the first: nothing cached yet), then both again, then identical repeats.
  const auto p = concat(pre(130), random_tokens(7, 1));
  const auto q = concat(pre(130), random_tokens(12, 2));
  const std::vector<std::vector<std::vector<int>>> waves = {{p, q}, {q, p}, {p}, {p}};
  auto on = f.make(opts(true));
  auto off = f.make(opts(false));
  const auto x = run_prefix_waves(*on, waves, 5);
  const auto y = run_prefix_waves(*off, waves, 5);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].tokens, y[i].tokens) << "request " << i;
    EXPECT_EQ(x[i].logprobs, y[i].logprobs) << "request " << i;
  }
  // Wave 2 reuses 128 for both; the repeats of p (137 tokens) 128 each too
  // (the boundary at 128; its generated tokens reach no further boundary).
  EXPECT_EQ(on->prefix_cache_stats().hits, 4 * 128);
  EXPECT_EQ(on->prefix_cache_stats().computed_tokens + on->prefix_cache_stats().hits,
            off->prefix_cache_stats().computed_tokens);
  EXPECT_EQ(on->free_kv_blocks(), on->kv_plan().num_blocks);  // every page back (cached ones are free)
}

// A boundary reached while decoding is snapshotted too: a follow-up prompt
// that extends prompt + answer (a chat's next turn) resumes from it. That
// state came from the delta rule's recurrent form (decode), where the cache
// off prefills the same tokens in the chunked form: the two agree to fp32
// reassociation (test_qwen3_5.cpp: decode against prefill), the 1e-3 bound.
TEST(Qwen3_5Prefix, DecodeSnapshotsServeTheNextTurn) {
  Fixture f;
  const auto prompt = random_tokens(60, 21);  // decode crosses the boundary at 64
  auto on = f.make(opts(true));
  auto off = f.make(opts(false));
  const auto r = testing::run_until_idle(*on, {prompt}, 10);
  ASSERT_EQ(r[0].tokens, testing::run_until_idle(*off, {prompt}, 10)[0].tokens);
  const auto next = concat(concat(prompt, r[0].tokens), random_tokens(5, 22));
  const int64_t before = on->prefix_cache_stats().hits;
  const auto a = testing::run_until_idle(*on, {next}, 10);
  const auto b = testing::run_until_idle(*off, {next}, 10);
  EXPECT_EQ(a[0].tokens, b[0].tokens);
  for (size_t j = 0; j < a[0].logprobs.size(); ++j) EXPECT_NEAR(a[0].logprobs[j], b[0].logprobs[j], 1e-3);
  EXPECT_EQ(on->prefix_cache_stats().hits - before, 64);
}

// A bf16 recurrent state (--mamba-ssm-cache-dtype bfloat16) is rounded once
// per step, so the cut at a snapshot boundary rounds it there: the cache on
// is not the cache off bitwise any more (within the bf16 state's bound,
// test_qwen3_5.cpp). What stays exact is the snapshot: a byte copy of the
// bf16 state (and conv state) at the boundary, so a later request that hits
// it computes bitwise what the request that made it computed after the
// boundary, and generates the same tokens with the same logprobs.
TEST(Qwen3_5Prefix, Bf16StateHitRepeatsTheSnapshottingRequest) {
  Fixture f;
  EngineOptions o = opts(true);
  o.ssm_state_dtype = StateDtype::bf16;
  auto on = f.make(o);
  const KvPlan& p = on->kv_plan();
  ASSERT_TRUE(p.state.snapshots());
  EXPECT_EQ(p.state.ssm_bytes_per_layer(), 2u * 8 * 8 * 2);  // [2][8][8] bf16
  const auto a = random_tokens(150, 51);
  const auto x = run_prefix_waves(*on, {{a}, {a}}, 8);
  ASSERT_EQ(x.size(), 2u);
  EXPECT_EQ(on->prefix_cache_stats().hits, 128);  // the boundary at 128 (<= 149 tokens)
  EXPECT_EQ(x[1].tokens, x[0].tokens);
  EXPECT_EQ(x[1].logprobs, x[0].logprobs);  // bitwise
}

TEST(Qwen3_5Prefix, UnalignedBoundariesAgreeWithinTheChunkingBound) {
  Fixture f;
  const auto base = random_tokens(120, 31);
  const auto a = concat(base, random_tokens(10, 32));
  const auto b = concat(std::vector<int>(base.begin(), base.begin() + 100), random_tokens(15, 33));
  const std::vector<std::vector<std::vector<int>>> waves = {{a}, {b}, {a}};
  auto on = f.make(opts(true, /*interval=*/3));  // every 12 tokens: splits the delta rule's 64-token chunks
  auto off = f.make(opts(false));
  const auto x = run_prefix_waves(*on, waves, 6);
  const auto y = run_prefix_waves(*off, waves, 6);
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].tokens, y[i].tokens) << "request " << i;
    for (size_t j = 0; j < x[i].logprobs.size(); ++j)
      worst = std::max(worst, static_cast<double>(std::abs(x[i].logprobs[j] - y[i].logprobs[j])));
  }
  EXPECT_LT(worst, 1e-3);
  // b shares 100 tokens: the last boundary is 96; a again: (130 - 1) / 4 = 32
  // whole blocks, the last boundary 96 (32 is not a multiple of 3: 30 blocks = 120).
  EXPECT_EQ(on->prefix_cache_stats().hits, 96 + 120);
}

// A pool with few snapshot slots and few blocks: many distinct prefixes evict
// snapshots (and blocks); the outputs still equal the cache off, bitwise.
TEST(Qwen3_5Prefix, SmallSnapshotPoolEvictsAndStaysCorrect) {
  Fixture f;
  EngineOptions o = opts(true);
  o.max_model_len = 160;
  o.max_num_seqs = 2;
  o.kv_memory_bytes = kv_memory_needed(f.cfg, shape_settings(o)) * 2;
  EngineOptions o_off = o;
  o_off.enable_prefix_caching = false;
  auto on = f.make(o);
  auto off = f.make(o_off);
  const int64_t slots = on->kv_plan().state.snapshot_slots;
  ASSERT_GT(slots, 0);
  ASSERT_LE(slots, 8);  // fewer than the boundaries below
  std::vector<std::vector<std::vector<int>>> waves;
  std::vector<std::vector<int>> prefixes;
  for (int i = 0; i < 6; ++i) prefixes.push_back(random_tokens(140, 40 + i));
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 6; ++i) waves.push_back({concat(prefixes[i], random_tokens(3 + i, 60 + 10 * round + i))});
  waves.push_back({concat(prefixes[5], random_tokens(4, 99))});  // the newest prefix: still snapshotted
  const auto x = run_prefix_waves(*on, waves, 4);
  const auto y = run_prefix_waves(*off, waves, 4);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].tokens, y[i].tokens) << "request " << i;
    EXPECT_EQ(x[i].logprobs, y[i].logprobs) << "request " << i;
  }
  const PrefixCacheStats st = on->prefix_cache_stats();
  EXPECT_EQ(st.computed_tokens + st.hits, off->prefix_cache_stats().computed_tokens);
  EXPECT_GE(st.hits, 128);  // at least the last request reused its two boundaries
  EXPECT_LT(st.hits, 7 * 128);  // not every repeat could: snapshots (or blocks) were evicted
  EXPECT_EQ(on->free_kv_blocks(), on->kv_plan().num_blocks);
}

// Preemption by recompute drops the running state; the snapshots stay valid
// cache entries, and the recompute resumes from them (same outputs).
TEST(Qwen3_5Prefix, PreemptionKeepsSnapshots) {
  Fixture f;
  EngineOptions o = opts(true);
  o.max_model_len = 160;
  KvPlanSettings s = shape_settings(o);
  s.prefix_caching = true;
  s.state_snapshot_interval = kInterval;
  o.kv_memory_bytes = kv_memory_needed(f.cfg, s) + 16 * 1024;  // about one request: the others wait or are preempted
  EngineOptions o_off = o;
  o_off.enable_prefix_caching = false;
  const auto shared = random_tokens(70, 71);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(concat(shared, random_tokens(20 + i, 80 + i)));
  auto on = f.make(o);
  auto off = f.make(o_off);
  const auto x = testing::run_until_idle(*on, prompts, 30);
  const auto y = testing::run_until_idle(*off, prompts, 30);
  // Tokens equal; logprobs to the decode-vs-prefill bound: a recompute
  // prefills tokens first decoded, and the two pools preempt at different
  // steps (the snapshots take blocks), in either run.
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].tokens, y[i].tokens) << "request " << i;
    for (size_t j = 0; j < x[i].logprobs.size() && j < y[i].logprobs.size(); ++j)
      EXPECT_NEAR(x[i].logprobs[j], y[i].logprobs[j], 1e-3) << "request " << i << " token " << j;
  }
  EXPECT_GT(on->num_preemptions(), 0);
  EXPECT_GT(on->prefix_cache_stats().hits, 0);
  EXPECT_EQ(on->free_kv_blocks(), on->kv_plan().num_blocks);
}

// The scheduler's side, step by step: the cut at a boundary, the save after
// it, the restore of a hit, and a one-slot pool evicting the older snapshot
// (whose blocks stay cached: a hit on them is cut back to 0).
TEST(Qwen3_5Prefix, SchedulerCutsSavesRestoresAndEvicts) {
  const ModelConfig cfg = tiny_qwen3_5();
  KvPlanSettings s;
  s.kv_memory_bytes = 4u << 20;
  s.max_model_len = 256;
  s.max_num_seqs = 4;
  s.max_num_batched_tokens = 256;
  s.block_size = kBlock;
  s.prefix_caching = true;
  s.state_snapshot_interval = kInterval;
  KvPlan plan = plan_kv_cache(cfg, s);
  plan.state.snapshot_slots = 1;  // one snapshot at a time
  KvCacheManager kv(cfg, plan);
  kv.set_prefix_caching(true);
  SchedulerLimits lim{4, 256, 256};
  Scheduler sch(kv, lim, {});
  const int snap0 = plan.state.snapshot_slot(0);

  auto run = [&](std::vector<int> prompt, RequestId id) {
    sch.add(testing::gen_request(id, std::move(prompt), 1, 256));
    std::vector<SchedulerOutput> steps;
    while (!sch.idle()) {
      SchedulerOutput o = sch.schedule();
      std::vector<int> sampled(o.seqs.size(), 5);
      sch.update(o, sampled);
      steps.push_back(std::move(o));
    }
    return steps;
  };
  const auto a = random_tokens(100, 1);
  auto st = run(a, 1);
  ASSERT_EQ(st.size(), 2u);  // [0, 64) cut at the boundary, then [64, 100) sampling
  EXPECT_EQ(st[0].seqs[0].num_tokens, 64);
  ASSERT_EQ(st[0].state_saves.size(), 1u);
  EXPECT_EQ(st[0].state_saves[0].second, snap0);
  EXPECT_TRUE(st[0].state_restores.empty());
  EXPECT_EQ(st[1].seqs[0].num_tokens, 36);
  EXPECT_TRUE(st[1].state_saves.empty());
  EXPECT_EQ(kv.num_snapshots(), 1);

  // The same prefix again: the hit ends at 64 and restores snapshot 0.
  st = run(concat(std::vector<int>(a.begin(), a.begin() + 80), random_tokens(5, 2)), 2);
  ASSERT_FALSE(st.empty());
  EXPECT_EQ(st[0].seqs[0].start, 64);
  ASSERT_EQ(st[0].state_restores.size(), 1u);
  EXPECT_EQ(st[0].state_restores[0].first, snap0);
  EXPECT_TRUE(st[0].state_saves.empty());  // 64 -> 85 reaches no new boundary
  EXPECT_EQ(sch.prefix_cache_hits(), 64);

  // Another prefix takes the one slot; a's blocks stay cached but lose
  // their snapshot, so a third run of a's prefix reuses nothing.
  const auto b = random_tokens(70, 3);
  st = run(b, 3);
  ASSERT_EQ(st[0].state_saves.size(), 1u);
  EXPECT_EQ(st[0].state_saves[0].second, snap0);
  EXPECT_EQ(kv.num_snapshots(), 1);
  EXPECT_EQ(kv.find_cached_prefix(a).tokens, 0);
  EXPECT_EQ(kv.find_cached_prefix(concat(b, {7})).tokens, 64);
  EXPECT_EQ(kv.find_cached_prefix(concat(b, {7})).state_slot, snap0);
  // Scoring is neither cut nor snapshotted.
  auto r = std::make_unique<SchedRequest>();
  r->id = 4;
  r->scoring = true;
  r->tokens = random_tokens(100, 4);
  r->num_prompt = 100;
  r->chunk = 256;
  ScoreResult res;
  r->result = &res;
  sch.add(std::move(r));
  SchedulerOutput o = sch.schedule();
  EXPECT_EQ(o.seqs[0].num_tokens, 100);
  EXPECT_TRUE(o.state_saves.empty());
  sch.update(o, std::vector<int>(o.seqs.size(), -1));
}

TEST(Qwen3_5Prefix, NoCachingOffReasonAndCapacityAgree) {
  Fixture f;
  // An automatic interval past max_model_len turns caching off, saying why.
  EngineOptions o = opts(true, 0);
  o.max_model_len = 60;  // the automatic interval is 64 tokens here
  auto e = f.make(o);
  EXPECT_FALSE(e->kv_plan().state.snapshots());
  EXPECT_NE(e->kv_plan().prefix_caching_off_reason.find("beyond max_model_len 60"), std::string::npos)
      << e->kv_plan().prefix_caching_off_reason;
  const auto p = random_tokens(40, 5);
  GenerateOptions g;
  g.max_tokens = 2;
  g.stop_at_eos = false;
  (void)e->generate(p, g);
  (void)e->generate(p, g);
  EXPECT_EQ(e->prefix_cache_stats().hits, 0);
  EXPECT_EQ(e->prefix_cache_stats().queries, 0);  // caching is off, not silently missing
  // An explicit interval past it is refused, naming the flag.
  o.state_snapshot_interval = 16;
  try {
    f.make(o);
    FAIL() << "expected an InputError";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("--state-snapshot-interval 16"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace fp8kv
