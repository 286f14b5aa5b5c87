// The same three greedy requests (prompts 9/17/30, max_tokens 40/25/12,
// EOS off) on a models_hd64 checkpoint with CUDA graphs or with
// EngineOptions::pad_decode_eager (same buckets and decode plan, ops one by
// one): every token, logprob and the graph counters. Shared by the graph
// tests at TP 1 (test_cuda_graphs.cpp) and TP 2 (test_tp_cuda.cpp).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace fp8kv::cudaops_test {

struct GraphTrace {
  std::vector<std::vector<int>> tokens;
  std::vector<std::vector<float>> logprobs;
  int64_t replays = 0, captures = 0;
};

inline GraphTrace run_graph_trace(const std::string& model, const std::string& dtype, bool graphs, uint64_t seed,
                                  int tp) {
  EngineOptions o;
  o.backend = BackendChoice::cuda;
  o.kv_cache_dtype = dtype;
  o.max_model_len = 128;
  o.kv_memory_bytes = 32u << 20;
  o.max_num_seqs = 8;
  o.tensor_parallel_size = tp;
  o.pad_decode_eager = !graphs;
  o.tp_cuda_graphs = true;  // TP > 1: the ranks capture (graphs) or pad the same way (pad_decode_eager)
  // `model`: a models_hd64 checkpoint's name, or a path under tests/golden ("models_qwen3_5/l3f1_hd64").
  const std::filesystem::path golden = std::filesystem::path(FP8KV_SOURCE_DIR) / "tests/golden";
  auto e = Engine::load(model.find('/') == std::string::npos ? golden / "models_hd64" / model : golden / model, o);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(3, e->config().vocab_size - 1);
  const int prompt_len[] = {9, 17, 30}, max_tokens[] = {40, 25, 12};
  GraphTrace t;
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

// A run with graphs (g) against the padded eager run (r) of the same
// requests: g captured the decode buckets 4, 2, 1 and replayed them, r
// replayed none, and every token and logprob is bitwise the same. `tag`
// starts the printed counts line and the failure messages.
inline void expect_graphs_equal_eager(const GraphTrace& g, const GraphTrace& r, const std::string& tag) {
  std::printf("%s: %lld captures, %lld replays\n", tag.c_str(), static_cast<long long>(g.captures),
              static_cast<long long>(g.replays));
  EXPECT_GE(g.captures, 3);  // buckets 4, 2, 1
  EXPECT_GT(g.replays, 30);
  EXPECT_EQ(r.replays, 0);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(g.tokens[i], r.tokens[i]) << tag << " request " << i;
    ASSERT_EQ(g.logprobs[i].size(), r.logprobs[i].size());
    for (size_t j = 0; j < g.logprobs[i].size(); ++j)
      EXPECT_EQ(0, std::memcmp(&g.logprobs[i][j], &r.logprobs[i][j], sizeof(float)))
          << tag << " request " << i << " token " << j << ": graph " << g.logprobs[i][j] << " vs eager "
          << r.logprobs[i][j];
  }
}

}  // namespace fp8kv::cudaops_test
