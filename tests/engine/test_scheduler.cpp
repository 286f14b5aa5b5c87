// Scheduler: decodes-first token budget, admission, preemption by recompute
// (same greedy tokens as an unpreempted run, no token twice, every block
// back in the pool).
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "kv/kv_cache_manager.h"
#include "model/weights.h"
#include "reference.h"

namespace fp8kv {
namespace {

using testing::tiny_config;

std::vector<int> random_tokens(const ModelConfig& c, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> t(n);
  for (auto& x : t) x = 3 + static_cast<int>(rng() % static_cast<uint64_t>(c.vocab_size - 3));  // no EOS (2)
  return t;
}

KvPlan plan_for(const ModelConfig& c, int max_model_len, int requests, int batched) {
  KvPlanSettings s;
  s.block_size = 4;
  s.max_model_len = max_model_len;
  s.max_num_batched_tokens = batched;
  s.dtype = KvDtype::bf16;
  s.kv_memory_bytes = kv_memory_needed(c, s) * static_cast<uint64_t>(requests);
  return plan_kv_cache(c, s);
}

std::unique_ptr<SchedRequest> gen_request(RequestId id, std::vector<int> prompt, int max_tokens, int chunk) {
  auto r = std::make_unique<SchedRequest>();
  r->id = id;
  r->tokens = std::move(prompt);
  r->num_prompt = static_cast<int>(r->tokens.size());
  r->chunk = chunk;
  r->gen.max_tokens = max_tokens;
  r->gen.stop_at_eos = false;
  return r;
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

struct RunResult {
  std::map<RequestId, std::vector<int>> tokens;
  std::map<RequestId, FinishReason> finish;
};

RunResult run_all(Engine& e, const std::vector<std::vector<int>>& prompts, int max_tokens) {
  RunResult r;
  std::vector<RequestId> ids;
  for (const auto& p : prompts) {
    GenerateOptions g;
    g.max_tokens = max_tokens;
    g.stop_at_eos = false;
    ids.push_back(e.submit(Request{p, g}));
  }
  while (!e.idle())
    for (const auto& ev : e.step()) {
      EXPECT_FALSE(r.finish.count(ev.id)) << "event after the request finished";
      if (ev.token >= 0) r.tokens[ev.id].push_back(ev.token);
      if (ev.finished) r.finish[ev.id] = *ev.finished;
    }
  RunResult ordered;  // keyed by submission index
  for (size_t i = 0; i < ids.size(); ++i) {
    ordered.tokens[i] = r.tokens[ids[i]];
    if (r.finish.count(ids[i])) ordered.finish[i] = r.finish[ids[i]];
  }
  return ordered;
}

// A pool too small for every request at once: running requests preempt the
// newest by recompute instead of failing, and every request still gets
// exactly the greedy tokens it gets alone, each once.
class Preemption : public ::testing::TestWithParam<std::string> {};

TEST_P(Preemption, RecomputeGivesTheSameGreedyTokens) {
  const std::string family = GetParam();
  const ModelConfig cfg = tiny_config(family);
  auto w = ModelWeights::random(cfg, 17, 0.15f, true);
  EngineOptions o;
  o.kv_cache_dtype = "fp8_e4m3";
  o.block_size = 4;
  o.max_model_len = 48;
  o.max_num_batched_tokens = 16;
  o.max_num_seqs = 8;
  // Room for two full-length requests; four run at once.
  {
    KvPlanSettings s;
    s.block_size = 4;
    s.max_model_len = 48;
    s.max_num_batched_tokens = 16;
    s.dtype = KvDtype::fp8_e4m3;
    o.kv_memory_bytes = kv_memory_needed(cfg, s) * 2;
  }
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
  EngineOptions o;
  o.kv_cache_dtype = "bf16";
  o.block_size = 4;
  o.max_model_len = 48;
  o.max_num_batched_tokens = 8;
  KvPlanSettings s;
  s.block_size = 4;
  s.max_model_len = 48;
  s.max_num_batched_tokens = 8;
  o.kv_memory_bytes = kv_memory_needed(cfg, s) * 2;
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
