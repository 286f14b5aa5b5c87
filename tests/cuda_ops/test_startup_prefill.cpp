// Startup and prefill-attention paths of the CUDA engine (docs/cuda_backend.md
// "Startup (2026-12-01)" and "Prefill attention in the engine"):
//  - the pinned, double-buffered weight upload writes the same device bytes
//    as the plain upload (bf16 copied, fp32 rounded RNE), across its 64 MB
//    staging chunks;
//  - the device dummy generator (FP8KV_DUMMY_DEVICE) gives the host's
//    elements, except where glibc's fp32 log / sin / cos round differently
//    from the correctly rounded value: then one bf16 ulp, and rarely;
//  - one op scope (CudaBackend::OpScope) feeds both op profiles: with
//    FP8KV_PREFILL_PROFILE and FP8KV_STEP_PROFILE on, a generate prints the
//    prefill profile's op classes and the step profile's op-timed decode step;
//  - FP8KV_PREFILL_Q_BF16=1 (q in bf16 on prefill-only steps). With a bf16
//    cache the attention kernels round q to bf16 (RNE) themselves, so the
//    logprobs are bitwise those of fp32 q. With an fp8 cache the kernels
//    round q to f16 (11-bit significand): q in bf16 first (8-bit) adds a
//    relative error of at most 2^-8 per q element, against 2^-4 per K
//    element from e4m3 itself, so its logprob change must be a small part of
//    the fp8 cache's own gap to the bf16 cache: at most 1/4 of it (the ratio
//    of the unit roundoffs is 1/16).
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "backend/backend.h"
#include "backend/cuda/check.h"
#include "backend/cuda/ops/dummy_fill.h"
#include "cuda_ops_util.h"
#include "engine/dummy_weights.h"
#include "engine/engine.h"
#include "model/weights.h"

namespace fp8kv {
namespace {

using namespace cudaops_test;

// Llama-shaped, head_dim 128 (the wgmma prefill kernel) or 64 (mma.sync).
ModelConfig small_llama(int head_dim, int vocab, int hidden) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", hidden},
                      {"intermediate_size", 2 * hidden}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"head_dim", head_dim}, {"vocab_size", vocab},
                      {"max_position_embeddings", 1024}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
                      {"tie_word_embeddings", false}, {"eos_token_id", 2}};
  return parse_model_config(j, "small llama test config");
}

TEST(CudaOps, StartupPinnedUploadBitwise) {
  FP8KV_NEED_GPU();
  // 66000 x 512 = 33.8M elements: more than one 2^25-element staging chunk.
  const ModelConfig cfg = small_llama(128, 66000, 512);
  for (bool bf16 : {true, false}) {
    auto w = ModelWeights::random(cfg, 91, 0.05f, bf16);
    ASSERT_TRUE(w->lm_head.has_value());
    auto be = make_cuda_backend(cfg, BackendOptions{});
    const BackendWeights bw = be->upload_weights(w);
    for (const auto& [host, dev] : {std::pair{&w->embed, &bw.embed}, std::pair{&*w->lm_head, &bw.output},
                                    std::pair{&w->layers[1].down_proj, &bw.layers[1].down_proj}}) {
      const size_t n = static_cast<size_t>(host->rows * host->cols);
      ASSERT_EQ(dev->rows, host->rows);
      ASSERT_EQ(dev->cols, host->cols);
      std::vector<uint16_t> got(n);
      be->download(got.data(), dev->data, n * 2);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        const uint16_t want = bf16 ? static_cast<const uint16_t*>(host->data)[i]
                                   : f32_to_bf16(static_cast<const float*>(host->data)[i]);
        bad += got[i] != want;
      }
      EXPECT_EQ(bad, 0u) << (bf16 ? "bf16" : "fp32") << " matrix " << host->rows << "x" << host->cols;
    }
  }
}

TEST(CudaOps, StartupDummyOnDeviceMatchesHost) {
  FP8KV_NEED_GPU();
  int64_t total = 0, differ = 0;
  for (uint64_t id : {0u, 1u, 7u, 200u}) {
    const int64_t n = (int64_t{1} << 22) + 1;  // odd: the last pair's second element is not stored
    const float sd = id == 7 ? 0.5f : 0.02f;
    const WeightMatrix h = dummy_matrix_block(3, id, 1, n, 0, 1, 0, n, sd);
    cuda::DeviceBuffer d(static_cast<size_t>(n) * 2);
    cuda::dummy_fill_bf16(d.as<uint16_t>(), dummy_matrix_key(3, id), n, sd, nullptr);
    FP8KV_CU(cudaDeviceSynchronize());
    const auto got = to_host<uint16_t>(d, static_cast<size_t>(n));
    const auto* want = static_cast<const uint16_t*>(h.data);
    for (int64_t i = 0; i < n; ++i) {
      ++total;
      if (got[i] == want[i]) continue;
      ++differ;
      // One bf16 ulp at most (same sign, neighbouring codes).
      EXPECT_LE(std::abs(static_cast<int>(got[i]) - static_cast<int>(want[i])), 1) << "id " << id << " element " << i;
    }
  }
  std::printf("[ dummy ] device vs host generator: %lld of %lld elements differ\n", static_cast<long long>(differ),
              static_cast<long long>(total));
  EXPECT_LE(differ, total / 100000);  // rare: <= 1e-5 of the elements
}

// `--load-format dummy` through Engine::load on the device generator vs the
// host one: the same model up to those rare one-ulp elements.
TEST(CudaOps, StartupDummyOnDeviceEngine) {
  FP8KV_NEED_GPU();
  const auto dir = std::filesystem::temp_directory_path() / ("fp8kv_dummy_dev_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  {
    nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 256},
                        {"intermediate_size", 512}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                        {"num_key_value_heads", 2}, {"head_dim", 128}, {"vocab_size", 512},
                        {"max_position_embeddings", 1024}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
                        {"tie_word_embeddings", false}, {"eos_token_id", 2}};
    std::ofstream(dir / "config.json") << j.dump();
  }
  std::vector<std::vector<int>> seqs = {{}};
  for (int t = 0; t < 200; ++t) seqs[0].push_back(3 + (t * 37) % 500);
  std::vector<ScoreResult> res[2];
  for (int dev = 0; dev < 2; ++dev) {
    if (dev) setenv("FP8KV_DUMMY_DEVICE", "1", 1);
    else setenv("FP8KV_DUMMY_DEVICE", "0", 1);
    EngineOptions o;
    o.backend = "cuda";
    o.load_format = "dummy";
    o.kv_cache_dtype = "bf16";
    o.kv_memory_bytes = 8u << 20;
    o.max_model_len = 512;
    auto eng = Engine::load(dir, o);
    res[dev] = eng->score_batch(seqs, ScoreOptions{});
  }
  unsetenv("FP8KV_DUMMY_DEVICE");  // (the suite never runs with it set)
  std::filesystem::remove_all(dir);
  double sum = 0;
  for (size_t p = 1; p < seqs[0].size(); ++p) {
    ASSERT_TRUE(std::isfinite(*res[1][0].logprobs[p]));
    sum += std::fabs(*res[1][0].logprobs[p] - *res[0][0].logprobs[p]);
  }
  std::printf("[ dummy ] engine, device vs host dummy weights: mean |dlogprob| %.2e\n", sum / (seqs[0].size() - 1));
  EXPECT_LE(sum / (seqs[0].size() - 1), 1e-3);
}

TEST(CudaOps, OpScopeFeedsBothProfiles) {
  FP8KV_NEED_GPU();
  const ModelConfig cfg = small_llama(128, 512, 256);
  auto w = ModelWeights::random(cfg, 95, 0.08f, true);
  setenv("FP8KV_PREFILL_PROFILE", "1", 1);
  unsetenv("FP8KV_PREFILL_PROFILE_SKIP");
  unsetenv("FP8KV_PREFILL_PROFILE_STEPS");
  setenv("FP8KV_STEP_PROFILE", "2", 1);
  testing::internal::CaptureStderr();
  {
    EngineOptions o;
    o.backend = "cuda";
    o.kv_cache_dtype = "fp8_e4m3";
    o.kv_memory_bytes = 8u << 20;
    o.max_model_len = 512;
    auto eng = Engine::create(cfg, w, o);  // both profiles read their variables here
    GenerateOptions g;
    g.max_tokens = 16;
    g.stop_at_eos = false;
    std::vector<int> prompt;
    for (int t = 0; t < 100; ++t) prompt.push_back(3 + (t * 11) % 500);
    (void)eng->generate(prompt, g);
  }  // the backend goes away: both profiles print their totals
  const std::string err = testing::internal::GetCapturedStderr();
  unsetenv("FP8KV_PREFILL_PROFILE");
  unsetenv("FP8KV_STEP_PROFILE");
  for (const char* want : {"prefill profile: step T=100", "gemm N=1024 K=256", "TFLOP/s", "attention (prefill)",
                           "add+rmsnorm", "qkv prep+store", "act (bf16 in)", "embedding", "step profile: eager op-timed decode step",
                           "step profile op: linear", "step profile op: attention", "step profile op: qkv_split_store",
                           "step profile op: add_rmsnorm", "step profile op: linear_gated_act"})
    EXPECT_NE(err.find(want), std::string::npos) << "missing '" << want << "' in:\n" << err;
  // Decode steps are below the prefill profile's 64-row threshold.
  EXPECT_EQ(err.find("prefill profile: step T=1 "), std::string::npos);
}

// Sets FP8KV_PREFILL_Q_BF16 (null: unset) and restores the caller's value
// (scripts/gpu_prefill_engine.sh runs the whole suite with it on, then off).
struct EnvGuard {
  explicit EnvGuard(const char* v) {
    if (const char* o = std::getenv("FP8KV_PREFILL_Q_BF16")) old_ = o, had_ = true;
    if (v)
      setenv("FP8KV_PREFILL_Q_BF16", v, 1);
    else
      unsetenv("FP8KV_PREFILL_Q_BF16");
  }
  ~EnvGuard() {
    if (had_)
      setenv("FP8KV_PREFILL_Q_BF16", old_.c_str(), 1);
    else
      unsetenv("FP8KV_PREFILL_Q_BF16");
  }
  std::string old_;
  bool had_ = false;
};

TEST(CudaOps, PrefillQBf16) {
  FP8KV_NEED_GPU();
  for (int D : {128, 64}) {
    const ModelConfig cfg = small_llama(D, 512, 256);
    auto w = ModelWeights::random(cfg, 93, 0.08f, /*bf16=*/true);
    std::mt19937_64 rng(test_seed());
    std::uniform_int_distribution<int> tok(3, cfg.vocab_size - 1);
    std::vector<std::vector<int>> seqs(3);
    const int lens[] = {300, 170, 90};  // prefill-only steps of >= 64 rows, several chunks
    for (int i = 0; i < 3; ++i)
      for (int t = 0; t < lens[i]; ++t) seqs[i].push_back(tok(rng));
    // res[dtype][q]: dtype 0 bf16, 1 fp8_e4m3; q 0 fp32, 1 bf16.
    std::vector<ScoreResult> res[2][2];
    for (int dt = 0; dt < 2; ++dt)
      for (int qb = 0; qb < 2; ++qb) {
        EnvGuard env(qb ? "1" : nullptr);
        EngineOptions o;
        o.backend = "cuda";
        o.kv_cache_dtype = dt ? "fp8_e4m3" : "bf16";
        o.kv_memory_bytes = 8u << 20;
        o.max_model_len = 512;
        o.max_num_batched_tokens = 256;
        auto eng = Engine::create(cfg, w, o);
        ScoreOptions so;
        so.chunk_size = 128;
        res[dt][qb] = eng->score_batch(seqs, so);
      }
    auto gap = [&](const std::vector<ScoreResult>& a, const std::vector<ScoreResult>& b, int* differ) {
      double sum = 0;
      int n = 0;
      for (size_t s = 0; s < seqs.size(); ++s)
        for (size_t p = 1; p < seqs[s].size(); ++p) {
          EXPECT_TRUE(std::isfinite(*a[s].logprobs[p]) && std::isfinite(*b[s].logprobs[p]));
          if (differ) *differ += *a[s].logprobs[p] != *b[s].logprobs[p];
          sum += std::fabs(*a[s].logprobs[p] - *b[s].logprobs[p]);
          ++n;
        }
      return sum / n;
    };
    int bf16_differ = 0, fp8_differ = 0;
    gap(res[0][1], res[0][0], &bf16_differ);
    const double fp8_q = gap(res[1][1], res[1][0], &fp8_differ);
    const double fp8_cache = gap(res[1][0], res[0][0], nullptr);
    std::printf("[ qbf16 ] D=%d: bf16 cache %d logprobs differ (want 0); fp8 cache: q bf16 vs fp32 mean |dlp| %.6f "
                "(%d differ), fp8 vs bf16 cache %.6f, ratio %.3f (limit 0.25)\n",
                D, bf16_differ, fp8_q, fp8_differ, fp8_cache, fp8_q / std::max(fp8_cache, 1e-12));
    EXPECT_EQ(bf16_differ, 0) << "D=" << D;
    EXPECT_LE(fp8_q, 0.25 * fp8_cache) << "D=" << D;
  }
}

}  // namespace
}  // namespace fp8kv
