// Startup and prefill-attention paths of the CUDA engine (docs/cuda_backend.md
// "Startup (2026-12-01)" and "Prefill attention in the engine"):
//  - the pinned, double-buffered weight upload writes the same device bytes
//    as the plain upload (bf16 copied, fp32 rounded RNE), across its 64 MB
//    staging chunks;
//  - the device dummy generator (--load-format dummy) gives the host's
//    elements, except where glibc's fp32 log / sin / cos round differently
//    from the correctly rounded value: then one bf16 ulp, and rarely;
//  - one op scope (CudaBackend::OpScope) feeds both op profiles: with
//    FP8KV_PROFILE=prefill,step=2 (set through the test hook), a generate
//    prints the prefill profile's op classes and the step profile's
//    op-timed decode step, and its tokens are those of an unprofiled run.
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "backend/backend.h"
#include "backend/common/profile.h"
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
  // [1]: `--load-format dummy` (matrices made on the device); [0]: the same
  // generator on the host (engine/dummy_weights.h), uploaded.
  for (int dev = 0; dev < 2; ++dev) {
    EngineOptions o;
    o.backend = BackendChoice::cuda;
    o.load_format = LoadFormat::dummy;
    o.kv_cache_dtype = "bf16";
    o.kv_memory_bytes = 8u << 20;
    o.max_model_len = 512;
    auto eng = dev ? Engine::load(dir, o)
                   : Engine::create(load_model_config(dir), dummy_weights(load_model_config(dir), 0, 0.02f, false), o);
    res[dev] = eng->score_batch(seqs, ScoreOptions{});
  }
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
  std::vector<int> prompt;
  for (int t = 0; t < 100; ++t) prompt.push_back(3 + (t * 11) % 500);
  auto generate = [&] {
    EngineOptions o;
    o.backend = BackendChoice::cuda;
    o.kv_cache_dtype = "fp8_e4m3";
    o.kv_memory_bytes = 8u << 20;
    o.max_model_len = 512;
    auto eng = Engine::create(cfg, w, o);  // the backend reads profile_config() here
    GenerateOptions g;
    g.max_tokens = 16;
    g.stop_at_eos = false;
    return eng->generate(prompt, g);
  };  // the backend goes away: both profiles print their totals
  const auto plain = generate();
  const ProfileConfig saved = profile_config();
  set_profile_config_for_testing(parse_profile_config("prefill,step=2"));
  ::testing::internal::CaptureStderr();
  const auto profiled = generate();
  const std::string err = ::testing::internal::GetCapturedStderr();
  set_profile_config_for_testing(saved);
  EXPECT_EQ(profiled.tokens, plain.tokens) << "profiling changed the generated tokens";
  for (const char* want : {"prefill profile: step T=100", "gemm N=1024 K=256", "TFLOP/s", "attention (prefill)",
                           "add+rmsnorm", "qkv prep+store", "act (bf16 in)", "embedding", "step profile: eager op-timed decode step",
                           "step profile op: linear", "step profile op: attention", "step profile op: qkv_split_store",
                           "step profile op: add_rmsnorm", "step profile op: linear_gated_act"})
    EXPECT_NE(err.find(want), std::string::npos) << "missing '" << want << "' in:\n" << err;
  // Decode steps are below the prefill profile's 64-row threshold.
  EXPECT_EQ(err.find("prefill profile: step T=1 "), std::string::npos);
}

}  // namespace
}  // namespace fp8kv
