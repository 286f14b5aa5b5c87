// Scheduler: decodes-first token budget, admission, preemption by recompute
// (same greedy tokens as an unpreempted run, no token twice, every block
// back in the pool).
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
using testing::random_tokens;
using testing::small_engine_options;
using testing::tiny_config;
using testing::with_pool_for;

KvPlan plan_for(const ModelConfig& c, int max_model_len, int requests, int batched) {
  return testing::plan_for_requests(c, testing::small_plan_settings(max_model_len, batched), requests);
}

// Decodes are scheduled before any prefill chunk and the step never exceeds
// the token budget; a long prompt admitted later fills only what is left.
TEST(Scheduler, DecodesFirstWithinTheTokenBudget) {
  const ModelConfig cfg = tiny_config("llama");
  const KvPlan plan = plan_for(cfg, 128, 8, 8);
  KvCacheManager kv(cfg, plan);
  SchedulerLimits lim{4, 8, plan.max_model_len};
  Scheduler s(kv, lim, {});
  s.add(gen_request(1, random_tokens(cfg, 3, 1), 20, 8));
  s.add(gen_request(2, random_tokens(cfg, 4, 2), 20, 8));
  // Step 1: both prompts prefill (3 + 4 <= 8).
  SchedulerOutput o = s.schedule();
  ASSERT_EQ(o.seqs.size(), 2u);
  EXPECT_EQ(o.num_tokens, 7);
  EXPECT_EQ(o.num_decodes, 0);
  s.update(o, std::vector<int>{5, 6});
  // A long prompt arrives; running requests decode first, it gets the rest.
  s.add(gen_request(3, random_tokens(cfg, 30, 3), 5, 8));
  for (int step = 0; step < 4; ++step) {
    o = s.schedule();
    EXPECT_LE(o.num_tokens, 8);
    ASSERT_GE(o.seqs.size(), 2u);
    EXPECT_EQ(o.num_decodes, 2) << "step " << step;
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(o.seqs[i].num_tokens, 1);
      EXPECT_NE(o.seqs[i].req->id, 3u);
    }
    ASSERT_EQ(o.seqs.size(), 3u);
    EXPECT_EQ(o.seqs[2].req->id, 3u);
    EXPECT_EQ(o.seqs[2].num_tokens, 6);  // 8 - 2 decodes
    s.update(o, std::vector<int>(o.seqs.size(), 7));
  }
  s.abort_all();
  EXPECT_EQ(kv.num_free_blocks(), plan.num_blocks);
}

// max_num_seqs bounds admission; the rest waits in FCFS order.
TEST(Scheduler, AdmitsAtMostMaxNumSeqs) {
  const ModelConfig cfg = tiny_config("llama");
  const KvPlan plan = plan_for(cfg, 64, 8, 64);
  KvCacheManager kv(cfg, plan);
  Scheduler s(kv, SchedulerLimits{2, 64, plan.max_model_len}, {});
  for (RequestId id = 1; id <= 3; ++id) s.add(gen_request(id, random_tokens(cfg, 5, id), 3, 64));
  SchedulerOutput o = s.schedule();
  ASSERT_EQ(o.seqs.size(), 2u);
  EXPECT_EQ(o.seqs[0].req->id, 1u);
  EXPECT_EQ(o.seqs[1].req->id, 2u);
  EXPECT_EQ(s.num_waiting(), 1);
  s.abort_all();
}

// Admission reserves for the whole prompt, not only its first chunk: a
// second request whose first chunk fits in the free pages, but whose whole
// prompt does not fit beside what the first request's prefill still needs,
// waits; one page shorter, it is admitted in the same step.
TEST(Scheduler, AdmissionReservesForTheWholePrompt) {
  const ModelConfig cfg = tiny_config("llama");  // full attention only: a prompt of L tokens holds ceil(L / 4) pages
  const KvPlan plan = plan_for(cfg, 64, 1, 16);
  const int64_t N = plan.num_blocks;
  ASSERT_GE(N, 12) << "the test needs room for request 1 (10 pages) and request 2's first chunk";
  for (const int64_t pages2 : {N - 10 + 1, N - 10}) {
    SCOPED_TRACE(pages2);
    KvCacheManager kv(cfg, plan);
    Scheduler s(kv, SchedulerLimits{4, 16, plan.max_model_len}, {});
    // Request 1: 40 tokens = 10 pages, prefilled in chunks of 8 (2 pages now, 8 still to come).
    s.add(gen_request(1, random_tokens(cfg, 40, 1), 4, 8));
    // Request 2: its first chunk (8 tokens, 2 pages) fits in the N - 2 free pages either way.
    s.add(gen_request(2, random_tokens(cfg, static_cast<int>(4 * pages2), 2), 4, 8));
    ASSERT_EQ(kv.blocks_to_hold(static_cast<int>(4 * pages2), 8), pages2);
    const SchedulerOutput o = s.schedule();
    const bool fits = pages2 <= N - 10;  // free pages minus request 1's outstanding reservation
    ASSERT_EQ(o.seqs.size(), fits ? 2u : 1u);
    EXPECT_EQ(o.seqs[0].req->id, 1u);
    EXPECT_EQ(o.seqs[0].num_tokens, 8);
    EXPECT_EQ(s.num_waiting(), fits ? 0 : 1);
    if (fits) {
      EXPECT_EQ(o.seqs[1].num_tokens, 8);
    }
    s.abort_all();
    EXPECT_EQ(kv.num_free_blocks(), N);
  }
}

// preempt() frees the newest request's blocks and puts it at the front of
// the waiting queue with its tokens; it is re-admitted and recomputed.
TEST(Scheduler, PreemptFreesBlocksAndRequeuesWithTokens) {
  const ModelConfig cfg = tiny_config("llama");
  const KvPlan plan = plan_for(cfg, 64, 8, 64);
  KvCacheManager kv(cfg, plan);
  Scheduler s(kv, SchedulerLimits{4, 64, plan.max_model_len}, {});
  s.add(gen_request(1, random_tokens(cfg, 9, 1), 10, 64));
  s.add(gen_request(2, random_tokens(cfg, 6, 2), 10, 64));
  SchedulerOutput o = s.schedule();
  s.update(o, std::vector<int>{11, 12});
  const int64_t free_before = kv.num_free_blocks();
  ASSERT_TRUE(s.preempt());
  EXPECT_GT(kv.num_free_blocks(), free_before);
  EXPECT_EQ(s.num_running(), 1);
  EXPECT_EQ(s.num_waiting(), 1);
  EXPECT_EQ(s.num_preemptions(), 1);
  o = s.schedule();  // request 1 decodes; request 2 re-admitted: all 7 tokens (6 + the generated 12)
  ASSERT_EQ(o.seqs.size(), 2u);
  EXPECT_EQ(o.seqs[0].req->id, 1u);
  EXPECT_EQ(o.seqs[0].num_tokens, 1);
  EXPECT_EQ(o.seqs[1].req->id, 2u);
  EXPECT_EQ(o.seqs[1].start, 0);
  EXPECT_EQ(o.seqs[1].num_tokens, 7);
  EXPECT_TRUE(o.seqs[1].samples);
  EXPECT_EQ(o.seqs[1].req->tokens.back(), 12);
  EXPECT_EQ(o.seqs[1].req->state, RequestState::running);
  s.abort_all();
  EXPECT_EQ(kv.num_free_blocks(), plan.num_blocks);
}

// Each request's tokens and finish, keyed by submission index.
struct RunResult {
  std::map<size_t, std::vector<int>> tokens;
  std::map<size_t, FinishReason> finish;
};

RunResult run_all(Engine& e, const std::vector<std::vector<int>>& prompts, int max_tokens) {
  RunResult r;
  const auto out = testing::run_until_idle(e, prompts, max_tokens);
  for (size_t i = 0; i < out.size(); ++i) {
    r.tokens[i] = out[i].tokens;
    if (out[i].finish) r.finish[i] = *out[i].finish;
  }
  return r;
}

// A pool too small for every request at once: running requests preempt the
// newest by recompute instead of failing, and every request still gets
// exactly the greedy tokens it gets alone, each once.
class Preemption : public ::testing::TestWithParam<std::string> {};

TEST_P(Preemption, RecomputeGivesTheSameGreedyTokens) {
  const std::string family = GetParam();
  const ModelConfig cfg = tiny_config(family);
  auto w = ModelWeights::random(cfg, 17, 0.15f, true);
  // Room for two full-length requests; four run at once.
  const EngineOptions o = with_pool_for(small_engine_options("fp8_e4m3", 48, 16, 8), cfg, 2);
  const int max_tokens = 30;
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_tokens(cfg, 6 + 4 * i, 100 + i));

  auto e = Engine::create(cfg, w, o);
  const RunResult together = run_all(*e, prompts, max_tokens);
  EXPECT_GT(e->num_preemptions(), 0) << "the pool was meant to be too small";
  EXPECT_EQ(e->free_kv_blocks(), e->kv_plan().num_blocks);  // every block back in the pool

  EngineOptions big = o;
  big.kv_memory_bytes = 0;  // default budget: no preemption
  auto alone = Engine::create(cfg, w, big);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const RunResult one = run_all(*alone, {prompts[i]}, max_tokens);
    ASSERT_EQ(together.tokens.at(i).size(), static_cast<size_t>(max_tokens)) << "request " << i;
    EXPECT_EQ(together.tokens.at(i), one.tokens.at(0)) << "request " << i;
    EXPECT_EQ(together.finish.at(i), FinishReason::length);
  }
  EXPECT_EQ(alone->num_preemptions(), 0);
}

INSTANTIATE_TEST_SUITE_P(All, Preemption, ::testing::Values("llama", "gemma3"));

// Scoring survives a preemption: each row is reported once, in order, and
// the logits equal scoring alone.
TEST(Preemption, ScoringRowsAreReportedOnce) {
  const ModelConfig cfg = tiny_config("qwen3");
  auto w = ModelWeights::random(cfg, 4, 0.15f, true);
  const EngineOptions o = with_pool_for(small_engine_options("bf16", 48, 8), cfg, 2);
  auto e = Engine::create(cfg, w, o);
  std::vector<std::vector<int>> seqs;
  for (int i = 0; i < 4; ++i) seqs.push_back(random_tokens(cfg, 40 + i, 7 + i));
  std::vector<std::vector<std::vector<float>>> rows(seqs.size());
  e->score_batch(seqs, {}, [&](int si, int pos, std::span<const float> l) {
    ASSERT_EQ(pos, static_cast<int>(rows[si].size()));
    rows[si].emplace_back(l.begin(), l.end());
  });
  EXPECT_EQ(e->free_kv_blocks(), e->kv_plan().num_blocks);
  for (size_t i = 0; i < seqs.size(); ++i) {
    ASSERT_EQ(rows[i].size(), seqs[i].size());
    std::vector<std::vector<float>> single;
    e->score(seqs[i], {}, [&](int, std::span<const float> l) { single.emplace_back(l.begin(), l.end()); });
    for (size_t p = 0; p < single.size(); ++p) ASSERT_EQ(single[p], rows[i][p]) << "seq " << i << " pos " << p;
  }
}

}  // namespace
}  // namespace fp8kv
