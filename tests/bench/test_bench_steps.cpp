// bench's step classification (bench/runner.h): which steps count as decode
// steps and which as full-batch decode steps (the whole batch decoding, no
// prefill), checked on the CPU backend against schedules derived by hand
// from the scheduler's policy (decodes first, then prefill chunks in
// admission order, at most max_num_batched_tokens tokens per step).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "../engine/reference.h"
#include "bench/runner.h"
#include "bench/traffic.h"
#include "engine/dummy_weights.h"
#include "engine/engine.h"

namespace fp8kv {
namespace {

TEST(BenchSteps, Classification) {
  using bench::classify_step;
  // Prefill still running for one request: neither.
  EXPECT_FALSE(classify_step(4, 4, 1, false).decode);
  EXPECT_FALSE(classify_step(4, 4, 1, false).full_batch);
  // Everyone decodes.
  EXPECT_TRUE(classify_step(4, 4, 0, false).decode);
  EXPECT_TRUE(classify_step(4, 4, 0, false).full_batch);
  // One request finished: a decode step, not a full-batch one.
  EXPECT_TRUE(classify_step(4, 3, 0, false).decode);
  EXPECT_FALSE(classify_step(4, 3, 0, false).full_batch);
  // A preemption's recompute is a prefill: not full-batch.
  EXPECT_TRUE(classify_step(4, 4, 0, true).decode);
  EXPECT_FALSE(classify_step(4, 4, 0, true).full_batch);
  // Nothing left.
  EXPECT_FALSE(classify_step(4, 0, 0, false).decode);
}

struct BenchRun {
  ModelConfig cfg;
  bench::BenchResult r;
};

// Batch 3, prompts of 8, 6 tokens each (max_tokens counts the first one),
// one timed iteration, bf16 cache.
BenchRun run_bench_of(int max_num_batched_tokens) {
  BenchRun out;
  out.cfg = testing::tiny_config("llama");
  EngineOptions o;
  o.backend = BackendChoice::cpu;
  o.kv_cache_dtype = "bf16";
  o.block_size = 4;
  o.max_model_len = 32;
  o.max_num_batched_tokens = max_num_batched_tokens;
  o.max_num_seqs = 8;
  o.kv_memory_bytes = 1 << 20;
  auto e = Engine::create(out.cfg, dummy_weights(out.cfg), o);
  bench::BenchSettings s;
  s.input_len = 8;
  s.output_len = 6;
  s.batch_size = 3;
  s.num_iters_warmup = 0;
  s.num_iters = 1;
  s.ignore_eos = true;
  out.r = bench::run_bench(*e, s, 1e9);
  return out;
}

void expect_consistent(const bench::BenchResult& r) {
  EXPECT_NEAR(r.full_batch_gbps * 1e9 * r.full_batch_decode_ms_per_step / 1e3, r.full_batch_bytes_per_step,
              1e-9 * r.full_batch_bytes_per_step);
  EXPECT_NEAR(r.full_batch_floor_fraction, r.full_batch_gbps / r.copy_gbps, 1e-12);
  EXPECT_DOUBLE_EQ(r.full_batch_bytes_per_step, r.full_batch_weight_bytes_per_step + r.full_batch_kv_bytes_per_step);
  EXPECT_GT(r.full_batch_decode_tokens_per_s, 0.0);
}

// One prefill step for all three: every later step is a full-batch decode
// step until they all finish together (5 steps), and the two counts agree.
TEST(BenchSteps, OneShotPrefillAllStepsFull) {
  const BenchRun x = run_bench_of(64);
  EXPECT_EQ(x.r.steps, 6);
  EXPECT_EQ(x.r.decode_steps, 5);
  EXPECT_EQ(x.r.full_batch_decode_steps, 5);
  // Decode step j (1..5) attends over 8 + j tokens in each sequence.
  EXPECT_DOUBLE_EQ(x.r.full_batch_context, 11.0);
  double kv = 0;
  for (int j = 1; j <= 5; ++j) kv += static_cast<double>(bench::decode_kv_bytes(x.cfg, KvDtype::bf16, std::vector<int>{8 + j, 8 + j, 8 + j}));
  EXPECT_DOUBLE_EQ(x.r.full_batch_kv_bytes_per_step, kv / 5);
  EXPECT_DOUBLE_EQ(x.r.full_batch_weight_bytes_per_step, static_cast<double>(bench::decode_weight_bytes(x.cfg, 3)));
  expect_consistent(x.r);
}

// 8 tokens per step staggers the first tokens:
//   step 1: r0 prefill 8            -> r0 first token
//   step 2: r0 decode, r1 prefill 7
//   step 3: r0 decode, r1 1, r2 6   -> r1 first token
//   step 4: r0, r1 decode, r2 2     -> r2 first token
//   steps 5-6: all three decode (full batch); r0 has its 6 tokens after step 6
//   steps 7-8: r1, r2 (r1 done after 8); step 9: r2.
// Decode steps (no request awaits its first token): 5-9; full-batch: 5-6,
// where the sequences attend over 12/10/9 and 13/11/10 tokens.
TEST(BenchSteps, ChunkedPrefillOnlyOverlapIsFull) {
  const BenchRun x = run_bench_of(8);
  EXPECT_EQ(x.r.steps, 9);
  EXPECT_EQ(x.r.decode_steps, 5);
  EXPECT_EQ(x.r.full_batch_decode_steps, 2);
  EXPECT_DOUBLE_EQ(x.r.full_batch_context, (12 + 10 + 9 + 13 + 11 + 10) / 6.0);
  const double kv = static_cast<double>(bench::decode_kv_bytes(x.cfg, KvDtype::bf16, std::vector<int>{12, 10, 9}) +
                                        bench::decode_kv_bytes(x.cfg, KvDtype::bf16, std::vector<int>{13, 11, 10}));
  EXPECT_DOUBLE_EQ(x.r.full_batch_kv_bytes_per_step, kv / 2);
  expect_consistent(x.r);
}

}  // namespace
}  // namespace fp8kv
