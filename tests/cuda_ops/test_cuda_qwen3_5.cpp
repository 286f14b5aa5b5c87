// The whole CUDA engine on the tiny Qwen3.5 checkpoints of
// tests/golden/models_qwen3_5 (Gated DeltaNet + gated full attention;
// tools/gen_gdn_goldens.py): teacher-forced logprobs against the CPU engine
// and transformers, and greedy decode through CUDA graphs against eager
// decode. Skipped without a GPU (or without the goldens).
//
// Acceptance lines:
//  - score: the CUDA engine rounds GEMM inputs to bf16, the CPU engine keeps
//    fp32 activations into every GEMM. The error that bf16 arithmetic opens
//    on these random models is measured by transformers itself: its bf16 run
//    of the same checkpoint ("bf16_compute", tools/gen_gdn_goldens.py
//    --add-bf16-compute; bf16 weights and activations, the delta rule in
//    fp32 as the engine keeps it). Lines: mean |logprob(cuda) - logprob(
//    transformers fp32)| <= transformers' own bf16 gap (the CUDA engine is at
//    least as close to the fp32 reference as transformers in bf16), and mean
//    |logprob(cuda) - logprob(cpu)| <= max(0.02, that gap), 0.02 being issue
//    12 §4's line for the dense CUDA engine (test_cuda_engine.cpp). A golden
//    without the variant keeps the 0.02 line alone.
//  - graphs: replay equals padded eager decode bitwise (test_cuda_graphs.cpp's
//    check, with padding sequences of state slot -1).
//  - decode vs transformers' cached decode: the first token equal, and the
//    logprobs within 0.05 (2.5x the score line) up to the first step where the
//    greedy choices part (bf16 GEMM inputs may flip a near tie of this random
//    model; the count of agreeing steps is printed). Where the first token
//    differs, it must be a near tie: under the CPU engine (fp32), its
//    logprob within 2x transformers' mean bf16 gap (a difference of two
//    logprobs, each moved by about that much) of transformers' token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "../engine/hf_golden.h"
#include "cuda_ops_util.h"
#include "graph_trace.h"
#include "engine/engine.h"

namespace fp8kv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace cudaops_test;

EngineOptions options(BackendChoice backend, bool eager = false) {
  EngineOptions o;
  o.backend = backend;
  o.kv_cache_dtype = "bf16";
  o.max_model_len = 128;
  o.kv_memory_bytes = 64u << 20;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 64;  // longer sequences prefill in chunks (state carried across them)
  o.enforce_eager = eager;
  return o;
}

// Mean |logprob(transformers bf16) - logprob(transformers fp32)| over the
// teacher-forced positions: what bf16 arithmetic moves a logprob on this
// model (0 when the golden has no "bf16_compute" variant).
double bf16_gap(const json& g) {
  return g["variants"].contains("bf16_compute") ? testing::variant_gap(g, "bf16_compute", "fp32") : 0.0;
}

class CudaQwen3_5 : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaQwen3_5, ScoreMatchesCpuEngine) {
  FP8KV_NEED_GPU();
  const std::string name = GetParam();
  json g;
  if (!testing::load_qwen3_5_golden(name, g)) GTEST_SKIP() << testing::qwen3_5_golden_dir(name) << " missing (tools/gen_gdn_goldens.py)";
  const std::vector<std::vector<int>> seqs = testing::golden_sequences(g);
  ScoreOptions so;
  so.chunk_size = 48;  // not a multiple of the CPU's 64-token chunks: its chunked form resumes unaligned
  std::vector<ScoreResult> res[2];
  for (int be = 0; be < 2; ++be) {
    auto e = Engine::load(testing::qwen3_5_golden_dir(name), options(be ? BackendChoice::cuda : BackendChoice::cpu));
    ASSERT_EQ(e->backend_name(), be ? "cuda" : "cpu");
    res[be] = e->score_batch(seqs, so);
  }
  const bool have_bf16 = g["variants"].contains("bf16_compute");
  double sum = 0, worst = 0, sum_golden = 0;
  int n = 0;
  size_t worst_s = 0, worst_p = 0;
  for (size_t s = 0; s < seqs.size(); ++s)
    for (size_t p = 1; p < seqs[s].size(); ++p) {
      ASSERT_TRUE(res[1][s].logprobs[p].has_value() && std::isfinite(*res[1][s].logprobs[p]))
          << name << " seq " << s << " pos " << p << ": no finite CUDA logprob";
      const double d = std::fabs(*res[1][s].logprobs[p] - *res[0][s].logprobs[p]);
      sum += d;
      if (d > worst) {
        worst = d;
        worst_s = s;
        worst_p = p;
      }
      sum_golden += std::fabs(*res[1][s].logprobs[p] - g["variants"]["fp32"][s]["logprobs"][p].get<double>());
      ++n;
    }
  std::printf("[ qwen3_5 ] %s cuda vs cpu engine: mean |dlogprob| %.5f (max %.4f at seq %zu pos %zu); cuda vs "
              "transformers fp32: mean %.5f; transformers bf16 vs fp32: %s\n",
              name.c_str(), sum / n, worst, worst_s, worst_p, sum_golden / n,
              have_bf16 ? std::to_string(bf16_gap(g)).c_str() : "(no bf16_compute variant)");
  const double gap = bf16_gap(g);
  EXPECT_LE(sum / n, std::max(0.02, gap))
      << name << ": mean |logprob(cuda) - logprob(cpu)| over " << n << " positions; worst " << worst << " at seq "
      << worst_s << " pos " << worst_p;
  if (have_bf16) {
    EXPECT_LE(sum_golden / n, gap) << name << ": the CUDA engine is further from transformers fp32 than "
                                      "transformers' own bf16 run";
  }
}

// Greedy decode with CUDA graphs against transformers' cached decode.
TEST_P(CudaQwen3_5, GraphDecodeFollowsTransformers) {
  FP8KV_NEED_GPU();
  const std::string name = GetParam();
  json g;
  if (!testing::load_qwen3_5_golden(name, g)) GTEST_SKIP() << testing::qwen3_5_golden_dir(name) << " missing (tools/gen_gdn_goldens.py)";
  const std::vector<int> prompt = g["decode"]["prompt"].get<std::vector<int>>();
  const std::vector<int> want = g["decode"]["ids"].get<std::vector<int>>();
  const std::vector<double> want_lp = g["decode"]["logprobs"].get<std::vector<double>>();
  auto e = Engine::load(testing::qwen3_5_golden_dir(name), options(BackendChoice::cuda));
  GenerateOptions o;
  o.max_tokens = static_cast<int>(want.size());
  o.stop_at_eos = false;
  o.logprobs = 0;
  e->submit(Request{prompt, o});
  std::vector<int> got;
  std::vector<double> got_lp;
  while (!e->idle())
    for (const StepEvent& ev : e->step())
      if (ev.token >= 0) {
        got.push_back(ev.token);
        got_lp.push_back(ev.logprob ? *ev.logprob : NAN);
      }
  EXPECT_GT(e->graph_replays(), 0) << name << ": no decode step ran from a CUDA graph";
  ASSERT_FALSE(got.empty());
  size_t i = 0;
  for (; i < std::min(got.size(), want.size()) && got[i] == want[i]; ++i)
    EXPECT_LE(std::fabs(got_lp[i] - want_lp[i]), 0.05) << name << " decode step " << i << ": cuda " << got_lp[i]
                                                         << ", transformers " << want_lp[i];
  std::printf("[ qwen3_5 ] %s: cuda greedy decode follows transformers for %zu of %zu steps\n", name.c_str(), i,
              want.size());
  if (i > 0) return;
  // The first token differs: a near tie under the fp32 CPU engine?
  auto cpu = Engine::load(testing::qwen3_5_golden_dir(name), options(BackendChoice::cpu));
  std::vector<int> a = prompt, b = prompt;
  a.push_back(want[0]);
  b.push_back(got[0]);
  const std::vector<std::vector<int>> ab = {a, b};
  const auto r = cpu->score_batch(ab, ScoreOptions{});
  const double lw = *r[0].logprobs.back(), lg = *r[1].logprobs.back(), tol = 2.0 * bf16_gap(g);
  std::printf("[ qwen3_5 ] %s: first token %d (cuda) vs %d (transformers); cpu engine logprobs %.4f vs %.4f, tie "
              "line %.4f\n",
              name.c_str(), got[0], want[0], lg, lw, tol);
  EXPECT_LE(lw - lg, tol) << name << ": the first decoded token differs from transformers' (" << got[0] << " vs " << want[0]
                   << ")";
}

// Graph replay == padded eager decode, bitwise (test_cuda_graphs.cpp's
// check): three requests of different lengths, buckets 4 (one padding
// sequence of state slot -1), 2 and 1, graphs replayed at contexts they were
// not captured with; the Gated DeltaNet kernels read each step's state
// slots from the step upload.
TEST_P(CudaQwen3_5, GraphReplayEqualsPaddedEager) {
  FP8KV_NEED_GPU();
  const std::string name = GetParam();
  if (!fs::exists(testing::qwen3_5_golden_dir(name) / "model.safetensors")) GTEST_SKIP() << testing::qwen3_5_golden_dir(name) << " missing";
  const uint64_t seed = test_seed();
  const GraphTrace gr = run_graph_trace("models_qwen3_5/" + name, "bf16", true, seed, 1),
                   pe = run_graph_trace("models_qwen3_5/" + name, "bf16", false, seed, 1);
  expect_graphs_equal_eager(gr, pe, "[ qwen3_5 graphs ] " + name);
}

// Prefix caching through state snapshots (docs/design.md "Prefix snapshots
// of the linear-attention state") on the CUDA engine: the cache on against
// the cache off, over shared prefixes shorter than, at and past the
// boundaries (every 64 tokens) and identical repeats. The hit counts and the
// tokens computed are exact (the hit rule is host bookkeeping). The outputs:
// the Gated DeltaNet prefill rows run the chunked form with chunks aligned
// to absolute multiples of 64, so a prefill cut at a boundary keeps its
// bits, and the restored state is a device byte copy; what may differ is
// the GEMMs' and attention's reduction order for the other batch shapes the
// cuts make (fp32 accumulation of the same bf16 inputs), and a snapshot
// taken after decode steps (recurrent form: within the chunked-vs-recurrent
// bound of test_gdn_cuda.cpp). So: the greedy tokens equal
// up to the first near tie that order can flip, and until then the
// logprobs within 5e-3, a quarter of the score line's 0.02 (the CPU-vs-CUDA
// gap, which also includes bf16 rounding of every GEMM input).
TEST_P(CudaQwen3_5, PrefixCacheOnAgreesWithOff) {
  FP8KV_NEED_GPU();
  const std::string name = GetParam();
  if (!fs::exists(testing::qwen3_5_golden_dir(name) / "model.safetensors")) GTEST_SKIP() << testing::qwen3_5_golden_dir(name) << " missing";
  EngineOptions on_o = options(BackendChoice::cuda);
  on_o.max_model_len = 256;
  on_o.max_num_batched_tokens = 256;
  on_o.enable_prefix_caching = true;
  on_o.state_snapshot_interval = 64 / on_o.block_size;  // every 64 tokens
  EngineOptions off_o = on_o;
  off_o.enable_prefix_caching = false;
  auto on = Engine::load(testing::qwen3_5_golden_dir(name), on_o);
  auto off = Engine::load(testing::qwen3_5_golden_dir(name), off_o);
  ASSERT_TRUE(on->kv_plan().state.snapshots()) << on->kv_plan().prefix_caching_off_reason;
  std::mt19937_64 rng(7);
  auto toks = [&](int n) {
    std::vector<int> t(n);
    for (auto& x : t) x = 3 + static_cast<int>(rng() % 250);
    return t;
  };
  const std::vector<int> base = toks(200);
  auto with = [&](int shared, int extra) {
    std::vector<int> t(base.begin(), base.begin() + shared);
    const auto e = toks(extra);
    t.insert(t.end(), e.begin(), e.end());
    return t;
  };
  // Waves (each run to idle before the next); expected hit per request.
  std::vector<std::pair<std::vector<int>, int>> reqs = {
      {with(40, 20), 0}, {with(40, 9), 0},   // shorter than a boundary
      {with(64, 20), 0}, {with(64, 9), 64},  // exactly at one
      // Past two: the first extends the 64-token prefix (hit 64) and
      // snapshots 128 on its way; the second reuses 128.
      {with(140, 20), 64}, {with(140, 9), 128},
      {with(150, 30), 128}};
  reqs.push_back(reqs.back());  // an identical repeat
  auto run = [&](Engine& e, const std::vector<int>& p, std::vector<int>& t, std::vector<double>& lp) {
    GenerateOptions g;
    g.max_tokens = 8;
    g.stop_at_eos = false;
    g.logprobs = 0;
    e.submit(Request{p, g});
    while (!e.idle())
      for (const StepEvent& ev : e.step())
        if (ev.token >= 0) {
          t.push_back(ev.token);
          lp.push_back(ev.logprob ? *ev.logprob : NAN);
        }
  };
  double worst = 0.0;
  int64_t want_hits = 0;
  for (size_t r = 0; r < reqs.size(); ++r) {
    std::vector<int> ta, tb;
    std::vector<double> la, lb;
    const int64_t before = on->prefix_cache_stats().hits;
    run(*on, reqs[r].first, ta, la);
    run(*off, reqs[r].first, tb, lb);
    want_hits += reqs[r].second;
    EXPECT_EQ(on->prefix_cache_stats().hits - before, reqs[r].second) << name << " request " << r;
    ASSERT_EQ(ta.size(), tb.size());
    EXPECT_EQ(ta[0], tb[0]) << name << " request " << r << ": first token";
    for (size_t j = 0; j < ta.size() && ta[j] == tb[j]; ++j) {
      worst = std::max(worst, std::fabs(la[j] - lb[j]));
      EXPECT_LE(std::fabs(la[j] - lb[j]), 5e-3) << name << " request " << r << " token " << j;
    }
  }
  std::printf("[ qwen3_5 prefix ] %s: %lld tokens hit, max |logprob on - off| %.3g\n", name.c_str(),
              static_cast<long long>(on->prefix_cache_stats().hits), worst);
  EXPECT_EQ(on->prefix_cache_stats().hits, want_hits);
  EXPECT_EQ(on->prefix_cache_stats().computed_tokens + want_hits, off->prefix_cache_stats().computed_tokens);
}

INSTANTIATE_TEST_SUITE_P(Goldens, CudaQwen3_5, ::testing::Values("l3f1_hd64", "l2f1_hd64", "l1f1_hd256"));

}  // namespace
}  // namespace fp8kv
