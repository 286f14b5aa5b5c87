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
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "model/weights.h"

#include <nlohmann/json.hpp>

namespace fp8kv {
namespace {

using namespace cudaops_test;

struct Trace {
  std::vector<std::vector<int>> tokens;
  std::vector<std::vector<float>> logprobs;
  int64_t replays = 0, captures = 0;
};

Trace run(const std::string& model, const std::string& dtype, bool graphs, uint64_t seed) {
  EngineOptions o;
  o.backend = "cuda";
  o.kv_cache_dtype = dtype;
  o.max_model_len = 128;
  o.kv_memory_bytes = 32u << 20;
  o.max_num_seqs = 8;
  o.pad_decode_eager = !graphs;
  auto e = Engine::load(std::filesystem::path(FP8KV_SOURCE_DIR) / "tests/golden/models_hd64" / model, o);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(3, e->config().vocab_size - 1);
  const int prompt_len[] = {9, 17, 30}, max_tokens[] = {40, 25, 12};
  Trace t;
  t.tokens.resize(3);
  t.logprobs.resize(3);
  std::vector<RequestId> ids;
  for (int i = 0; i < 3; ++i) {
    Request r;
    for (int j = 0; j < prompt_len[i]; ++j) r.prompt.push_back(tok(rng));
    r.options.max_tokens = max_tokens[i];
    r.options.stop_at_eos = false;
    r.options.logprobs = 0;
    ids.push_back(e->submit(std::move(r)));
  }
  while (!e->idle())
    for (const StepEvent& ev : e->step()) {
      if (ev.token < 0) continue;
      const size_t i = static_cast<size_t>(std::find(ids.begin(), ids.end(), ev.id) - ids.begin());
      t.tokens.at(i).push_back(ev.token);
      t.logprobs.at(i).push_back(ev.logprob.value_or(NAN));
    }
  t.replays = e->graph_replays();
  t.captures = e->graph_captures();
  return t;
}

void check(const std::string& model, const std::string& dtype) {
  const uint64_t seed = test_seed();
  const Trace g = run(model, dtype, true, seed), r = run(model, dtype, false, seed);
  std::printf("[ graphs ] %s %s: %lld captures, %lld replays\n", model.c_str(), dtype.c_str(),
              static_cast<long long>(g.captures), static_cast<long long>(g.replays));
  EXPECT_GE(g.captures, 3);  // buckets 4, 2, 1
  EXPECT_GT(g.replays, 30);
  EXPECT_EQ(r.replays, 0);
  EXPECT_EQ(r.captures, 0);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(g.tokens[i], r.tokens[i]) << "request " << i;
    ASSERT_EQ(g.logprobs[i].size(), r.logprobs[i].size());
    for (size_t j = 0; j < g.logprobs[i].size(); ++j)
      EXPECT_EQ(0, std::memcmp(&g.logprobs[i][j], &r.logprobs[i][j], sizeof(float)))
          << "request " << i << " token " << j << ": graph " << g.logprobs[i][j] << " vs eager " << r.logprobs[i][j];
  }
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

TEST(CudaGraphs, Buckets) {
  // vLLM's capture sizes, bounded by max_num_seqs; no GPU needed (CPU backend).
  const ModelConfig cfg = parse_model_config(
      nlohmann::json{{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 16},
                     {"intermediate_size", 32}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                     {"num_key_value_heads", 1}, {"vocab_size", 32}, {"max_position_embeddings", 64}},
      "bucket test config");
  auto be = make_backend("cpu", cfg, BackendOptions{});
  ModelRunner mr(cfg, *be, ModelWeights::random(cfg, 1, 0.1f, false), 64, 40);
  const std::pair<int, int> want[] = {{1, 1}, {2, 2}, {3, 4}, {4, 4}, {5, 8}, {9, 16}, {17, 24}, {33, 40}, {40, 40}, {41, 0}};
  for (auto [s, b] : want) EXPECT_EQ(mr.graph_bucket(s), b) << s;
}

}  // namespace
}  // namespace fp8kv
