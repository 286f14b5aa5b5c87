// The CPU engine on a tiny random Qwen3.5 model (Gated DeltaNet layers +
// gated full attention): the state pool's life cycle (zeroed at a sequence's
// first token, carried across prefill chunks and decode steps, slots reused),
// chunked prefill against one-shot, decode against prefill, batching,
// preemption by recompute. Prefix caching through state snapshots is
// test_qwen3_5_prefix.cpp; the transformers comparison is
// test_goldens_qwen3_5.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/errors.h"
#include "engine/engine.h"
#include "engine_fixtures.h"
#include "io/errors.h"
#include "kv/planner.h"
#include "model/config.h"
#include "model/weights.h"

namespace fp8kv {
using ::testing::HasSubstr;
namespace {

ModelConfig tiny_hybrid() { return testing::tiny_qwen3_5_config(); }

std::vector<int> hybrid_tokens(int n, uint64_t seed) { return testing::random_tokens(tiny_hybrid(), n, seed); }

EngineOptions hybrid_opts(int max_num_seqs = 8) {
  EngineOptions o;
  o.backend = BackendChoice::cpu;
  o.kv_cache_dtype = "bf16";
  o.block_size = 4;
  o.max_model_len = 256;
  o.max_num_batched_tokens = 256;
  o.max_num_seqs = max_num_seqs;
  o.kv_memory_bytes = 8u << 20;
  return o;
}

struct HybridFixture {
  ModelConfig cfg = tiny_hybrid();
  std::shared_ptr<const ModelWeights> w = ModelWeights::random(cfg, 42, 0.15f, /*bf16=*/true);
  std::unique_ptr<Engine> make(const EngineOptions& o = hybrid_opts()) { return Engine::create(cfg, w, o); }
};

double max_logprob_diff(const ScoreResult& a, const ScoreResult& b) {
  double m = 0.0;
  for (size_t i = 1; i < a.logprobs.size(); ++i) m = std::max(m, std::abs(*a.logprobs[i] - *b.logprobs[i]));
  return m;
}

TEST(Qwen3_5Engine, PlanCountsTheStatePoolAndOnlyAttentionLayers) {
  HybridFixture f;
  EngineOptions o = hybrid_opts();
  o.enable_prefix_caching = false;  // no snapshot pool (test_qwen3_5_prefix.cpp counts that one)
  auto e = f.make(o);
  const KvPlan& p = e->kv_plan();
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_EQ(p.groups[0].layers, std::vector<int>{3});
  EXPECT_EQ(p.state.layers, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(p.state.num_slots, 8);
  // Per linear layer: conv [C = 2*8 + 16 = 32][K-1 = 3] bf16 + recurrent [2][8][8] f32.
  EXPECT_EQ(p.state.bytes_per_sequence(), 3u * (32 * 3 * 2 + 2 * 8 * 8 * 4));
  EXPECT_EQ(p.pool_bytes() + p.state.pool_bytes() <= (8u << 20), true);
  EXPECT_EQ(p.num_blocks, static_cast<int64_t>(((8u << 20) - p.state.pool_bytes()) / p.page_bytes));
}

TEST(Qwen3_5Engine, ChunkedPrefillAt64IsBitwiseOneShotAndOtherwiseClose) {
  HybridFixture f;
  auto e = f.make();
  const auto toks = hybrid_tokens(150, 1);
  const ScoreResult one = e->score(toks);
  ScoreOptions c64;
  c64.chunk_size = 64;
  const ScoreResult a = e->score(toks, c64);
  EXPECT_EQ(one.logprobs, a.logprobs);  // GDN chunks are aligned to absolute multiples of 64
  ScoreOptions c10;
  c10.chunk_size = 10;
  const ScoreResult b = e->score(toks, c10);
  // Other boundaries reassociate the delta rule's sums (fp32, gdn.h; the
  // per-layer bound of test_gdn.cpp is ~1e-4 of the state scale), which the
  // logprobs see through 3 linear layers: well under 1e-3.
  const double d = max_logprob_diff(one, b);
  EXPECT_LT(d, 1e-3);
  EXPECT_EQ(one.top1_ids, b.top1_ids);
  for (size_t i = 1; i < one.logprobs.size(); ++i) ASSERT_TRUE(std::isfinite(*one.logprobs[i]));
}

TEST(Qwen3_5Engine, DecodeAgreesWithPrefillAndSlotsAreReused) {
  HybridFixture f;
  auto e = f.make();
  const auto prompt = hybrid_tokens(37, 2);
  GenerateOptions g;
  g.max_tokens = 12;
  g.stop_at_eos = false;
  const GenerateResult r1 = e->generate(prompt, g);
  ASSERT_EQ(r1.tokens.size(), 12u);
  // Another sequence in between, then the first again: a reused slot starts
  // from zero states, so the tokens repeat exactly.
  (void)e->generate(hybrid_tokens(20, 3), g);
  const GenerateResult r2 = e->generate(prompt, g);
  EXPECT_EQ(r1.tokens, r2.tokens);
  // The decode steps (recurrent form) against prefill of the same tokens
  // (chunked form): the same greedy choices.
  std::vector<int> all = prompt;
  all.insert(all.end(), r1.tokens.begin(), r1.tokens.end());
  const ScoreResult s = e->score(all);
  for (size_t i = 0; i < r1.tokens.size(); ++i)
    EXPECT_EQ(*s.top1_ids[prompt.size() + i], r1.tokens[i]) << "generated token " << i;
}

TEST(Qwen3_5Engine, BatchedEqualsAloneAndPreemptionRecomputes) {
  HybridFixture f;
  const std::vector<std::vector<int>> prompts = {hybrid_tokens(30, 4), hybrid_tokens(45, 5), hybrid_tokens(12, 6)};
  GenerateOptions g;
  g.max_tokens = 20;
  g.stop_at_eos = false;
  std::vector<std::vector<int>> alone;
  {
    auto e = f.make();
    for (const auto& p : prompts) alone.push_back(e->generate(p, g).tokens);
  }
  for (bool tight : {false, true}) {
    EngineOptions o = hybrid_opts();
    if (tight) {  // a pool for about one request of 66 tokens: the others are preempted and recomputed
      KvPlanSettings s;
      s.block_size = o.block_size;
      s.max_model_len = 66;
      s.max_num_seqs = o.max_num_seqs;
      s.max_num_batched_tokens = o.max_num_batched_tokens;
      o.max_model_len = 66;
      o.kv_memory_bytes = kv_memory_needed(f.cfg, s) + 4 * 1024;
    }
    auto e = f.make(o);
    std::map<RequestId, std::vector<int>> got;
    std::vector<RequestId> ids;
    for (const auto& p : prompts) ids.push_back(e->submit(Request{p, g}));
    while (!e->idle())
      for (const StepEvent& ev : e->step())
        if (ev.token >= 0) got[ev.id].push_back(ev.token);
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[ids[i]], alone[i]) << "prompt " << i << " tight " << tight;
    if (tight) {
      EXPECT_GT(e->num_preemptions(), 0);
    }
  }
}

// Tensor parallelism shards the linear heads like attention heads
// (test_tp_qwen3_5_fp8.cpp runs it): this model's single key head cannot
// be split over 2 ranks, and the refusal names both linear head fields.
TEST(Qwen3_5Engine, TensorParallelNeedsTheLinearHeadsToDivide) {
  HybridFixture f;
  EngineOptions o = hybrid_opts();
  o.tensor_parallel_size = 2;
  EXPECT_THAT(test_util::input_error_of([&] { f.make(o); }),
              HasSubstr("--tensor-parallel-size 2 does not divide linear_num_key_heads 1 and "
                        "linear_num_value_heads 2"));
}

}  // namespace
}  // namespace fp8kv
