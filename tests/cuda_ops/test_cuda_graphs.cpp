// CUDA graphs (issue 12 §4): a decode step replayed from a captured graph
// equals an eager step at the same padded batch and decode plan, bitwise.
//
// Two engines on the same tiny checkpoint (tests/golden/models_hd64: llama,
// head_dim 64, llama3 rope; gemma3, head_dim 256, sliding + full layers,
// softcaps), the same requests, greedy: one with CUDA graphs, one with
// EngineOptions::pad_decode_eager (decode steps padded to the same bucket,
// block tables as wide, decode plan for max_model_len, ops launched one by
// one). Three requests of different prompt and output lengths, so the decode
// batch shrinks 3 -> 2 -> 1 (buckets 4, 2, 1: padding rows, several graphs)
// and each graph is replayed with contexts it was not captured with. Every
// generated token and its logprob (float, from the logits of that step) must
// be identical; the graph engine must have replayed graphs, the other none.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "cuda_ops_util.h"
#include "graph_trace.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "model/weights.h"

#include <nlohmann/json.hpp>

namespace fp8kv {
namespace {

using namespace cudaops_test;

using Trace = GraphTrace;

Trace run(const std::string& model, const std::string& dtype, bool graphs, uint64_t seed) {
  return run_graph_trace(model, dtype, graphs, seed, /*tp=*/1);
}

void check(const std::string& model, const std::string& dtype) {
  const uint64_t seed = test_seed();
  const Trace g = run(model, dtype, true, seed), r = run(model, dtype, false, seed);
  expect_graphs_equal_eager(g, r, "[ graphs ] " + model + " " + dtype);
  EXPECT_EQ(r.captures, 0);
}

TEST(CudaGraphs, ReplayEqualsPaddedEagerLlamaBf16) {
  FP8KV_NEED_GPU();
  check("llama", "bf16");
}
TEST(CudaGraphs, ReplayEqualsPaddedEagerLlamaFp8) {
  FP8KV_NEED_GPU();
  check("llama", "fp8_e4m3");
}
TEST(CudaGraphs, ReplayEqualsPaddedEagerGemma3Fp8) {
  FP8KV_NEED_GPU();
  check("gemma3", "fp8_e4m3");
}
// Per-token-head caches: the scale arrays beside the caches are captured like
// the caches; their store runs as the separate store kernel in the graph.
TEST(CudaGraphs, ReplayEqualsPaddedEagerLlamaPerTokenHead) {
  FP8KV_NEED_GPU();
  check("llama", "fp8_per_token_head");
}
TEST(CudaGraphs, ReplayEqualsPaddedEagerGemma3Int8PerTokenHead) {
  FP8KV_NEED_GPU();
  check("gemma3", "int8_per_token_head");
}

TEST(CudaGraphs, Buckets) {
  // vLLM's capture sizes, bounded by max_num_seqs; no GPU needed (CPU backend).
  const ModelConfig cfg = parse_model_config(
      nlohmann::json{{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 16},
                     {"intermediate_size", 32}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                     {"num_key_value_heads", 1}, {"vocab_size", 32}, {"max_position_embeddings", 64}},
      "bucket test config");
  auto be = make_backend(BackendChoice::cpu, cfg, BackendOptions{});
  ModelRunner mr(cfg, *be, ModelWeights::random(cfg, 1, 0.1f, false), 64, 40);
  const std::pair<int, int> want[] = {{1, 1}, {2, 2}, {3, 4}, {4, 4}, {5, 8}, {9, 16}, {17, 24}, {33, 40}, {40, 40}, {41, 0}};
  for (auto [s, b] : want) EXPECT_EQ(mr.graph_bucket(s), b) << s;
}

}  // namespace
}  // namespace fp8kv
