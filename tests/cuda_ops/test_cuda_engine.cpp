// The whole engine on --backend cuda vs --backend cpu (the same random
// head_dim-64 Qwen3 model): teacher-forced logprobs, bf16 and fp8 caches.
// The acceptance lines are issue 12 §4's: with a bf16 cache, mean |delta
// logprob| <= 0.02 against the CPU engine; with fp8, the CUDA engine's gap to
// the CPU bf16 run within 1.5x of the CPU fp8 engine's own gap. The CPU
// engine keeps activations fp32 into every GEMM; the CUDA engine rounds GEMM
// inputs to bf16 (relative 2^-8 per element); the measured gap is printed
// (docs/cuda_backend.md). A wiring error (a wrong slot, block table, rope
// table or scale) scrambles the attention and lands far above the line.
#include <cmath>
#include <nlohmann/json.hpp>

#include <gmock/gmock.h>

#include <cstring>
#include <limits>

#include <unistd.h>

#include "../engine/fp8_checkpoint.h"
#include "cuda_ops_util.h"
#include "engine/engine.h"
#include "io/errors.h"
#include "model/weights.h"

namespace fp8kv {
namespace {

using namespace cudaops_test;

TEST(CudaEngine, ScoreMatchesCpuEngine) {
  FP8KV_NEED_GPU();
  const ModelConfig cfg = small_qwen3_config();
  auto w = ModelWeights::random(cfg, 77, 0.08f, /*bf16=*/true);
  const auto seqs = random_token_seqs(cfg, {150, 97, 33});  // cross the 40-token window and 16-token pages
  // res[backend][dtype]: backend 0 = cpu, 1 = cuda; dtype 0 = bf16, 1 = fp8_e4m3.
  std::vector<ScoreResult> res[2][2];
  for (int be = 0; be < 2; ++be)
    for (int dt = 0; dt < 2; ++dt) {
      EngineOptions o;
      o.backend = be ? BackendChoice::cuda : BackendChoice::cpu;
      o.kv_cache_dtype = dt ? "fp8_e4m3" : "bf16";
      o.kv_memory_bytes = 8u << 20;
      o.max_model_len = 512;
      o.max_num_batched_tokens = 64;  // chunked prefill over several steps, sequences batched
      auto eng = Engine::create(cfg, w, o);
      ScoreOptions so;
      so.chunk_size = 48;
      res[be][dt] = eng->score_batch(seqs, so);
    }
  auto gap = [&](const std::vector<ScoreResult>& a, const std::vector<ScoreResult>& b) {
    double sum = 0;
    int n = 0;
    for (size_t s = 0; s < seqs.size(); ++s)
      for (size_t p = 1; p < seqs[s].size(); ++p) {
        EXPECT_TRUE(std::isfinite(*a[s].logprobs[p]) && std::isfinite(*b[s].logprobs[p]));
        sum += std::fabs(*a[s].logprobs[p] - *b[s].logprobs[p]);
        ++n;
      }
    return sum / n;
  };
  // The CPU engine with a bf16 cache (fp32 activations) is the reference.
  const double bf16_gap = gap(res[1][0], res[0][0]);
  const double cpu_fp8_gap = gap(res[0][1], res[0][0]), cuda_fp8_gap = gap(res[1][1], res[0][0]);
  std::printf("[ engine ] mean |dlogprob| vs cpu bf16: cuda bf16 %.5f, cpu fp8 %.5f, cuda fp8 %.5f; cuda fp8 vs cpu fp8 %.5f\n",
              bf16_gap, cpu_fp8_gap, cuda_fp8_gap, gap(res[1][1], res[0][1]));
  // Issue 12 section 4: bf16 never worse than 0.02; fp8 within 1.5x of the CPU engine's fp8 gap.
  EXPECT_LE(bf16_gap, 0.02);
  EXPECT_LE(cuda_fp8_gap, 1.5 * cpu_fp8_gap);
}

// The KV clip counter (docs/robustness.md "KV clipping") on the CUDA engine
// against the CPU engine's on the same teacher-forced run: the stored
// elements per layer are equal (the same tokens in the same KV groups; the
// state-free layers of this model all store); the clipped counts agree
// within 1% of the stored elements (the CUDA engine's K/V differ from the
// CPU's by its bf16 GEMM inputs, 2^-8 relative, so only elements that close
// to the threshold can flip), and are 0 on both where the scale is unity.
TEST(CudaEngine, KvClipCountsMatchCpuEngine) {
  FP8KV_NEED_GPU();
  const ModelConfig cfg = small_qwen3_config();
  auto w = ModelWeights::random(cfg, 79, 0.08f, /*bf16=*/true);
  const auto seqs = random_token_seqs(cfg, {90, 60});
  std::vector<KvClipCounts> c[2];
  for (int be = 0; be < 2; ++be) {
    EngineOptions o;
    o.backend = be ? BackendChoice::cuda : BackendChoice::cpu;
    o.kv_cache_dtype = "fp8_e4m3";
    o.kv_memory_bytes = 8u << 20;
    o.max_model_len = 512;
    o.max_num_batched_tokens = 64;
    auto eng = Engine::create(cfg, w, o);
    KvScales sc = KvScales::unity(cfg.num_layers);
    sc.layers[0].v.values = {1e-6f};  // nearly every V element clips
    sc.layers[1].k.values = {1e-3f};  // |k| > 0.448 clips: some
    eng->set_kv_scales(sc);
    ScoreOptions so;
    so.chunk_size = 40;
    eng->score_batch(seqs, so);
    const auto counts = eng->kv_clip_counts();
    ASSERT_TRUE(counts.has_value()) << backend_choice_name(o.backend);
    c[be] = *counts;
  }
  ASSERT_EQ(c[0].size(), c[1].size());
  for (size_t l = 0; l < c[0].size(); ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    EXPECT_EQ(c[1][l].stored, c[0][l].stored);
    EXPECT_GT(c[0][l].stored, 0u);
    const double tol = 0.01 * static_cast<double>(c[0][l].stored);
    EXPECT_LE(std::fabs(static_cast<double>(c[1][l].k) - static_cast<double>(c[0][l].k)), tol);
    EXPECT_LE(std::fabs(static_cast<double>(c[1][l].v) - static_cast<double>(c[0][l].v)), tol);
    if (l >= 2) {
      EXPECT_EQ(c[1][l].k + c[1][l].v, 0u);  // unity scales: these activations stay far below 448
    }
  }
  std::printf("[ clips ] layer 0 V: cpu %llu cuda %llu of %llu; layer 1 K: cpu %llu cuda %llu\n",
              static_cast<unsigned long long>(c[0][0].v), static_cast<unsigned long long>(c[1][0].v),
              static_cast<unsigned long long>(c[0][0].stored), static_cast<unsigned long long>(c[0][1].k),
              static_cast<unsigned long long>(c[1][1].k));
  EXPECT_GT(c[0][0].v, c[0][0].stored * 9 / 10);
  EXPECT_GT(c[1][0].v, c[1][0].stored * 9 / 10);
}

TEST(CudaEngine, GreedyGenerateRuns) {
  FP8KV_NEED_GPU();
  const ModelConfig cfg = small_qwen3_config();
  auto w = ModelWeights::random(cfg, 78, 0.08f, true);
  EngineOptions o;
  o.backend = BackendChoice::cuda;
  o.kv_cache_dtype = "fp8";
  o.kv_memory_bytes = 8u << 20;
  o.max_model_len = 512;
  auto eng = Engine::create(cfg, w, o);
  GenerateOptions g;
  g.max_tokens = 20;
  g.stop_at_eos = false;
  const std::vector<int> prompt = {5, 9, 11, 300, 42, 7};
  const auto a = eng->generate(prompt, g);
  const auto b = eng->generate(prompt, g);
  ASSERT_EQ(a.tokens.size(), 20u);
  EXPECT_EQ(a.tokens, b.tokens);  // greedy is deterministic
  g.sampling.temperature = 0.8f;
  g.sampling.top_p = 0.9f;
  g.sampling.seed = 1234;
  const auto c = eng->generate(prompt, g);
  const auto d = eng->generate(prompt, g);
  EXPECT_EQ(c.tokens, d.tokens);  // seeded sampling replays
  for (int t : c.tokens) EXPECT_TRUE(t >= 0 && t < cfg.vocab_size);
}

// Finite but absurd weights on the CUDA engine (docs/robustness.md "Finite
// but absurd weights"): the failed step is re-run eagerly with each stage's
// output downloaded, and the error (InputError: exit 2) names the stage and
// its largest weight, read from the caller's in-memory weights (create()) or
// from the checkpoint re-opened (load()); a NaN weight is named as the CPU
// engine names it.
std::string cuda_failure(const std::function<std::unique_ptr<Engine>(const EngineOptions&)>& make) {
  EngineOptions o;
  o.backend = BackendChoice::cuda;
  o.kv_cache_dtype = "bf16";
  o.kv_memory_bytes = 8u << 20;
  o.max_model_len = 64;
  auto e = make(o);
  GenerateOptions g;
  g.max_tokens = 3;
  const std::vector<int> prompt = {5, 9, 13, 17, 21};
  try {
    e->generate(prompt, g);
  } catch (const InputError& err) {
    return err.what();
  }
  return "";
}

TEST(CudaEngine, AbsurdWeightsNameTheStage) {
  FP8KV_NEED_GPU();
  using ::testing::HasSubstr;
  const ModelConfig cfg = small_qwen3_config();
  auto w = ModelWeights::random(cfg, 7, 0.15f, /*bf16=*/true);
  EXPECT_EQ(cuda_failure([&](const EngineOptions& o) { return Engine::create(cfg, w, o); }), "");
  for (int i = 0; i < 8; ++i) w->layers[1].post_attention_norm[static_cast<size_t>(i)] = 3.39e38f;
  const std::string m = cuda_failure([&](const EngineOptions& o) { return Engine::create(cfg, w, o); });
  EXPECT_THAT(m, HasSubstr("every weight is finite, but layer 1's output overflowed float32"));
  EXPECT_THAT(m, HasSubstr("its largest weight: model.layers.1.post_attention_layernorm.weight holds 3.39e+38"));
}

TEST(CudaEngine, AbsurdCheckpointIsReopenedToNameTheWeight) {
  FP8KV_NEED_GPU();
  using ::testing::HasSubstr;
  const auto dir = std::filesystem::temp_directory_path() / ("fp8kv_cuda_absurd_" + std::to_string(::getpid()));
  const auto write = [&](float value) {
    std::filesystem::remove_all(dir);
    testing::Fp8CheckpointOptions c;
    c.twin = true;  // an f32 checkpoint (no quantization config)
    c.edit_config = [](nlohmann::json& j) { j["head_dim"] = 64; };  // a head_dim the CUDA kernels take
    c.mutate = [value](std::vector<TensorToWrite>& ts, nlohmann::json&, nlohmann::json&) {
      TensorToWrite& t = testing::find_tensor(ts, "model.layers.1.post_attention_layernorm.weight");
      for (int i = 0; i < 8; ++i) std::memcpy(t.data.data() + 4 * i, &value, 4);
    };
    testing::write_fp8_checkpoint(dir, c);
  };
  const auto load = [&](const EngineOptions& o) { return Engine::load(dir, o); };
  write(3.39e38f);
  std::string m = cuda_failure(load);
  EXPECT_THAT(m, HasSubstr("layer 1's output overflowed float32"));
  EXPECT_THAT(m, HasSubstr("its largest weight: model.layers.1.post_attention_layernorm.weight holds 3.39e+38"));
  write(std::numeric_limits<float>::quiet_NaN());
  m = cuda_failure(load);
  EXPECT_THAT(m, HasSubstr("model.layers.1.post_attention_layernorm.weight (layer 1) holds NaN"));
  std::filesystem::remove_all(dir);
}

// An e4m3 NaN byte in an fp8 weight: the fp8 GEMV would read it as a finite
// value, so the CUDA backend refuses the checkpoint at upload (InputError:
// exit 2), naming the tensor and the element.
TEST(CudaEngine, Fp8NanWeightByteIsRefusedAtUpload) {
  FP8KV_NEED_GPU();
  using ::testing::HasSubstr;
  const auto dir = std::filesystem::temp_directory_path() / ("fp8kv_cuda_fp8nan_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  testing::Fp8CheckpointOptions c;
  c.edit_config = [](nlohmann::json& j) { j["head_dim"] = 64; };
  c.mutate = [](std::vector<TensorToWrite>& ts, nlohmann::json&, nlohmann::json&) {
    testing::find_tensor(ts, "model.layers.1.mlp.gate_proj.weight").data[5] = std::byte{0x7f};
  };
  testing::write_fp8_checkpoint(dir, c);
  EngineOptions o;
  o.backend = BackendChoice::cuda;
  o.kv_cache_dtype = "bf16";
  o.kv_memory_bytes = 8u << 20;
  o.max_model_len = 64;
  std::string m;
  try {
    Engine::load(dir, o);
  } catch (const InputError& e) {
    m = e.what();
  }
  EXPECT_THAT(m, HasSubstr("model.layers.1.mlp.gate_proj.weight (layer 1) holds NaN at element 5"));
  EXPECT_THAT(m, HasSubstr("e4m3 NaN byte"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fp8kv
