// Tensor parallelism on CUDA (one process, one thread and one context per
// GPU, NCCL communicators from backend/cuda/comm/nccl.h): TP = 2 vs TP = 1 on
// the same random head_dim-64 Qwen3 model as test_cuda_engine.cpp. Skips
// with fewer than 2 GPUs (CI, the 1-GPU machine).
// Tolerance: issue 12's engine line (mean |delta logprob| <= 0.02 with a bf16
// cache). TP changes the fp32 summation order of o_proj / down_proj (NCCL's
// ring or the one-shot kernel adds the two partials) and, through that, can
// move an activation across a bf16 rounding boundary at the next GEMM's
// input (2^-8 relative of one element): far below that line. A wiring error
// (wrong head slice, scale shard or gather order) scrambles the logits and
// lands far above it. Greedy generation must give the same tokens.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <nlohmann/json.hpp>

#include "../engine/hf_golden.h"
#include "cuda_ops_util.h"
#include "graph_trace.h"
#include "engine/dummy_weights.h"
#include "engine/engine.h"
#include "model/weights.h"

namespace fp8kv {
namespace {

using namespace cudaops_test;

#define FP8KV_NEED_2_GPUS()    \
  if (cuda::cuda_device_count() < 2) \
  GTEST_SKIP() << "tensor parallel needs 2 CUDA devices (found " << cuda::cuda_device_count() << ")"

EngineOptions opts(const std::string& dtype, int tp) {
  EngineOptions o;
  o.backend = BackendChoice::cuda;
  o.kv_cache_dtype = dtype;
  o.kv_memory_bytes = 8u << 20;
  o.max_model_len = 512;
  o.max_num_batched_tokens = 64;
  o.tensor_parallel_size = tp;
  return o;
}

TEST(CudaTensorParallel, Tp2ScoreMatchesTp1) {
  FP8KV_NEED_2_GPUS();
  const ModelConfig cfg = small_qwen3_config();
  auto w = ModelWeights::random(cfg, 77, 0.08f, /*bf16=*/true);
  const auto seqs = random_token_seqs(cfg, {150, 97, 33});
  for (const char* dtype : {"bf16", "fp8_e4m3"}) {
    ScoreOptions so;
    so.chunk_size = 48;
    const auto a = Engine::create(cfg, w, opts(dtype, 1))->score_batch(seqs, so);
    const auto b = Engine::create(cfg, w, opts(dtype, 2))->score_batch(seqs, so);
    double sum = 0, mx = 0;
    int n = 0, top1 = 0;
    for (size_t s = 0; s < seqs.size(); ++s)
      for (size_t p = 1; p < seqs[s].size(); ++p) {
        ASSERT_TRUE(std::isfinite(*b[s].logprobs[p]));
        const double d = std::fabs(*a[s].logprobs[p] - *b[s].logprobs[p]);
        sum += d;
        mx = std::max(mx, d);
        top1 += *a[s].top1_ids[p] == *b[s].top1_ids[p];
        ++n;
      }
    std::printf("[ tp ] %s: TP 2 vs TP 1 mean |dlogprob| %.6f, max %.6f, top-1 agree %d/%d\n", dtype, sum / n, mx,
                top1, n);
    EXPECT_LE(sum / n, 0.02) << dtype;
    EXPECT_GE(top1, n - n / 50) << dtype;  // near-ties aside, the same argmax
  }
}

TEST(CudaTensorParallel, Tp2GreedyGenerationMatchesTp1) {
  FP8KV_NEED_2_GPUS();
  const ModelConfig cfg = small_qwen3_config();
  auto w = ModelWeights::random(cfg, 78, 0.08f, true);
  GenerateOptions g;
  g.max_tokens = 24;
  g.stop_at_eos = false;
  const std::vector<int> prompt = {5, 9, 11, 300, 42, 7};
  const auto a = Engine::create(cfg, w, opts("fp8", 1))->generate(prompt, g);
  auto e2 = Engine::create(cfg, w, opts("fp8", 2));
  const auto b = e2->generate(prompt, g);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(e2->generate(prompt, g).tokens, b.tokens);  // deterministic across runs
}

// TP 2 vs TP 1 scores of one model under `o` (issue 12's line, as above):
// mean |dlogprob| <= 0.02, the same argmax but for near-ties.
void expect_tp2_matches_tp1(const std::function<std::unique_ptr<Engine>(int tp)>& make,
                            const std::vector<std::vector<int>>& seqs, const std::string& what) {
  ScoreOptions so;
  so.chunk_size = 48;
  const auto a = make(1)->score_batch(seqs, so);
  const auto b = make(2)->score_batch(seqs, so);
  double sum = 0, mx = 0;
  int n = 0, top1 = 0;
  for (size_t s = 0; s < seqs.size(); ++s)
    for (size_t p = 1; p < seqs[s].size(); ++p) {
      ASSERT_TRUE(std::isfinite(*b[s].logprobs[p])) << what;
      const double d = std::fabs(*a[s].logprobs[p] - *b[s].logprobs[p]);
      sum += d;
      mx = std::max(mx, d);
      top1 += *a[s].top1_ids[p] == *b[s].top1_ids[p];
      ++n;
    }
  std::printf("[ tp ] %s: TP 2 vs TP 1 mean |dlogprob| %.6f, max %.6f, top-1 agree %d/%d\n", what.c_str(), sum / n,
              mx, top1, n);
  EXPECT_LE(sum / n, 0.02) << what;
  EXPECT_GE(top1, n - n / 50) << what;
}

// Qwen3.5 hybrids (Gated DeltaNet + gated attention; docs/design.md "Tensor
// parallelism"): the transformers-layout checkpoints of
// tests/golden/models_qwen3_5 whose linear heads split at TP 2, each rank
// holding its heads' states.
TEST(CudaTensorParallel, Qwen3_5Tp2ScoreMatchesTp1) {
  FP8KV_NEED_2_GPUS();
  for (const char* c : {"l1f1_hd256", "l3f1_hd64"}) {
    const std::filesystem::path dir = testing::qwen3_5_golden_dir(c);
    nlohmann::json g;
    if (!testing::load_qwen3_5_golden(c, g)) GTEST_SKIP() << dir << " missing (tools/gen_gdn_goldens.py)";
    const std::vector<std::vector<int>> seqs = testing::golden_sequences(g);
    expect_tp2_matches_tp1(
        [&](int tp) {
          EngineOptions o = opts("bf16", tp);
          o.max_model_len = 128;
          o.max_num_seqs = 4;
          return Engine::load(dir, o);
        },
        seqs, std::string("qwen3_5 ") + c);
  }
}

// FP8 weights (W8A16), 128x128 blocks: a shape whose rank cuts are whole
// blocks (q 512 rows, k/v 256, ffn 512 at TP 2), fp8 dummy weights made on
// the host; each rank uploads its shard's bytes and block scales (fused
// q|k|v and gate|up per rank).
TEST(CudaTensorParallel, Fp8BlockWeightsTp2ScoreMatchesTp1) {
  FP8KV_NEED_2_GPUS();
  nlohmann::json j = nlohmann::json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
    "vocab_size": 512, "max_position_embeddings": 1024, "eos_token_id": 2, "tie_word_embeddings": false,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]}
  })");
  const ModelConfig cfg = parse_model_config(j, "fp8 block TP test config");
  std::shared_ptr<const ModelWeights> w = dummy_weights(cfg, 21, 0.08f);
  ASSERT_TRUE(w->has_fp8());
  const auto seqs = random_token_seqs(cfg, {90, 90});
  expect_tp2_matches_tp1([&](int tp) { return Engine::create(cfg, w, opts("bf16", tp)); }, seqs, "fp8 block W8A16");
}

// CUDA graphs on TP ranks (EngineOptions::tp_cuda_graphs, set by run_graph_trace): each
// rank's decode step is captured with its collectives (NCCL / the one-shot
// all-reduce on fixed buffers) and replayed; test_cuda_graphs.cpp's check at
// TP 2: the same requests, greedy, with graphs vs EngineOptions::
// pad_decode_eager (same buckets and decode plan, ops one by one); every
// token and logprob bitwise equal (the collectives are deterministic: the
// same kernels, inputs and order in both runs).
void check_tp_graphs(const std::string& dtype) {
  const GraphTrace g = run_graph_trace("llama", dtype, true, 11, /*tp=*/2),
                   r = run_graph_trace("llama", dtype, false, 11, /*tp=*/2);
  expect_graphs_equal_eager(g, r, "[ tp ] graphs TP 2 " + dtype);
}

TEST(CudaTensorParallel, GraphReplayEqualsPaddedEagerTp2Bf16) {
  FP8KV_NEED_2_GPUS();
  check_tp_graphs("bf16");
}
TEST(CudaTensorParallel, GraphReplayEqualsPaddedEagerTp2Fp8) {
  FP8KV_NEED_2_GPUS();
  check_tp_graphs("fp8_e4m3");
}

}  // namespace
}  // namespace fp8kv
