// Startup capture of the decode CUDA graphs (ModelRunner::warm_up_graphs,
// docs/cuda_backend.md "CUDA graphs at startup"): Engine::load captures one
// graph per decode bucket before any request, after a max-size eager prefill
// that sizes the scratch buffers, so that serving never captures (a capture
// is an eager step plus instantiation: tens of ms at a new batch size) and no
// later step grows a buffer (which would drop every graph). Checked on the
// CUDA backend: the counters before and after a mixed run, and the tokens and
// logprobs of the run against pad_decode_eager (bitwise, as
// test_cuda_graphs.cpp).
#include <gtest/gtest.h>

#include <cstring>

#include "cuda_ops_util.h"
#include "engine/engine.h"
#include "graph_trace.h"

namespace fp8kv {
namespace {

using namespace cudaops_test;

std::unique_ptr<Engine> load(bool eager) {
  EngineOptions o;
  o.backend = BackendChoice::cuda;
  o.kv_cache_dtype = "fp8_e4m3";
  o.max_model_len = 128;
  o.kv_memory_bytes = 32u << 20;
  o.max_num_seqs = 8;
  o.pad_decode_eager = eager;
  return Engine::load(std::filesystem::path(FP8KV_SOURCE_DIR) / "tests/golden/models_hd64/llama", o);
}

TEST(CudaGraphWarmup, EveryBucketCapturedAtLoadAndNoneLater) {
  FP8KV_NEED_GPU();
  auto e = load(false);
  // Buckets 1, 2, 4, 8 for max_num_seqs 8.
  EXPECT_EQ(e->graph_captures(), 4);
  EXPECT_EQ(e->graph_replays(), 0);
  // The graph trace's three requests (prefills of 9 / 17 / 30 tokens, then
  // decode steps at 3, 2, 1 sequences): every decode step replays.
  const GraphTrace g = run_graph_trace("llama", "fp8_e4m3", true, 7, 1);
  EXPECT_EQ(g.captures, 4) << "a step captured after startup (a scratch buffer grew, or a bucket was missed)";
  const GraphTrace r = run_graph_trace("llama", "fp8_e4m3", false, 7, 1);
  EXPECT_EQ(r.captures, 0);  // pad_decode_eager: no graphs at all
  expect_graphs_equal_eager(g, r, "[ graphs ] after warm-up, llama fp8_e4m3");
}

TEST(CudaGraphWarmup, EnforceEagerCapturesNothing) {
  FP8KV_NEED_GPU();
  EngineOptions o;
  o.backend = BackendChoice::cuda;
  o.max_model_len = 128;
  o.kv_memory_bytes = 32u << 20;
  o.max_num_seqs = 8;
  o.enforce_eager = true;
  auto e = Engine::load(std::filesystem::path(FP8KV_SOURCE_DIR) / "tests/golden/models_hd64/llama", o);
  EXPECT_EQ(e->graph_captures(), 0);
}

}  // namespace
}  // namespace fp8kv
