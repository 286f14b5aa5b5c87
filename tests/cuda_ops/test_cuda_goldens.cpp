// The CUDA engine against transformers on the head_dim 64 / 256 checkpoints
// (tests/golden/models_hd64, tools/gen_model_goldens_hd64.py): the CPU test's
// comparison (tests/engine/hf_golden.h) with backend "cuda", whose acceptance
// lines are issue 12 §4's: bf16 cache (and the fp32 variant, which runs with
// a bf16 cache): mean |logprob - golden fp32| <= min(1.5 x transformers' own
// bf16-vs-fp32 gap, 0.02); fp8 caches: <= 1.5 x the fp8 golden's own gap to
// fp32 (the CPU engine's fp8 gap, which it matches to fp32 tolerance).
// Layer-0 K/V at the store point within the bound hf_golden.h's
// kv_layer0_bounds derives (bf16 GEMM inputs: 2^-9 sum |x_i W_ji| plus fp32
// accumulation, the RoPE partner's bound added for K; 2^-7 (1 + |K|)
// where the model has QK-norm or a non-plain RMSNorm). The goldens' sequences are prefilled in one step of
// up to 112 rows, so these run the prefill GEMM path (past the GEMV rows),
// with the bf16 gate|up output (docs/cuda_backend.md "Prefill/TTFT").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "../engine/hf_golden.h"
#include "cuda_ops_util.h"
#include "engine/engine.h"

namespace fp8kv {
namespace {

class CudaGoldenHd64 : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(CudaGoldenHd64, CudaMatchesTransformers) {
  FP8KV_NEED_GPU();
  // Runs by default (skips without a GPU) since run K2 of 2026-12-01: all
  // 20 cases pass with hf_golden.h's derived layer-0 K/V bound for bf16
  // GEMMs (docs/cuda_backend.md "Run L" and the eighth session's section).
  const auto [name, variant] = GetParam();
  const testing::GoldenOutcome r = testing::check_hf_golden(name, variant, BackendChoice::cuda);
  std::printf("[ golden ] %s %s cuda: mean |dlogprob| vs golden %.5f, vs fp32 %.5f (max %.4f)\n", name.c_str(),
              variant.c_str(), r.mean_abs_vs_variant, r.mean_abs_vs_fp32, r.max_abs_vs_variant);
  RecordProperty("mean_abs_dlogprob_vs_fp32", std::to_string(r.mean_abs_vs_fp32));
}

INSTANTIATE_TEST_SUITE_P(All, CudaGoldenHd64,
                         ::testing::Combine(::testing::Values("llama", "mistral", "qwen2", "qwen3", "gemma3"),
                                            ::testing::Values("fp32", "bf16", "fp8_e4m3", "fp8_e5m2")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

}  // namespace
}  // namespace fp8kv

namespace fp8kv {
namespace {

// FP8-weight checkpoints (tests/golden/fp8_weights, tools/gen_fp8_weight_goldens.py)
// on the CUDA engine, W8A16. The goldens' sequences are prefilled in one step,
// so every GEMM runs the dequantize + cuBLASLt path: each weight rounded once
// to bf16 (the golden's own "w8a16_bf16_weights" reference: transformers with
// exactly those bf16 weights) and each GEMM input rounded to bf16 (the
// backend's bf16 activations, rounding of the same relative size, 2^-9, on the
// other operand). Two independent roundings of the size the bf16-weights
// reference measures: mean |logprob - golden w8a16| <= 2 x that reference's
// mean gap to the golden.
// The Qwen3.5 hybrid (qwen3_5_block) takes the line of the CUDA Qwen3.5
// goldens (test_cuda_qwen3_5.cpp) instead: transformers' own bf16 run of the
// same checkpoint ("w8a16_bf16_compute": the dequantized weights rounded to
// bf16, exactly the CUDA engine's, and bf16 activations, the delta rule in
// fp32 as the engine keeps it) rounds everything the CUDA engine rounds (the
// weights, every GEMM input; the conv inputs the golden rounds too) and more
// (the residual stream, the conv output, q, k, v and the gates before the
// rule upcasts them), so mean |logprob - golden w8a16| <= that run's mean
// gap to the golden: the CUDA engine at least as close to the fp32
// reference as transformers in bf16.
double mean_gap(const nlohmann::json& a, const nlohmann::json& b) {
  double sum = 0;
  int64_t n = 0;
  for (size_t s = 0; s < a.size(); ++s)
    for (size_t i = 1; i < a[s].size(); ++i, ++n) sum += std::fabs(a[s][i].get<double>() - b[s][i].get<double>());
  return n ? sum / static_cast<double>(n) : 0.0;
}

// One golden case's engine: bf16 cache, the goldens' 256-token context.
std::unique_ptr<Engine> load_fp8_case(const std::filesystem::path& dir, BackendChoice backend, Fp8Compute mode) {
  EngineOptions o;
  o.backend = backend;
  o.kv_cache_dtype = "bf16";
  o.max_model_len = 256;
  o.kv_memory_bytes = 64u << 20;
  o.fp8_weight_mode = mode;
  return Engine::load(dir, o);
}

class CudaFp8WeightGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaFp8WeightGolden, W8A16MatchesTransformers) {
  FP8KV_NEED_GPU();
  namespace fs = std::filesystem;
  const std::string name = GetParam();
  const fs::path dir = fs::path(FP8KV_SOURCE_DIR) / "tests/golden/fp8_weights" / name;
  if (!fs::exists(dir / "golden.json")) GTEST_SKIP() << "golden files missing in " << dir;
  std::ifstream in(dir / "golden.json");
  const nlohmann::json g = nlohmann::json::parse(in);
  auto e = load_fp8_case(dir, BackendChoice::cuda, Fp8Compute::w8a16);
  const nlohmann::json& ref = g["w8a16"];
  const bool hybrid = g["family"] == "qwen3_5";
  if (hybrid) {
    ASSERT_TRUE(g.contains("w8a16_bf16_compute"))
        << dir << ": no w8a16_bf16_compute; run `python3 tools/gen_fp8_weight_goldens.py --only " << name << "`";
  }
  const double weights_line = 2.0 * mean_gap(g["w8a16_bf16_weights"], ref);
  const double bound = hybrid ? mean_gap(g["w8a16_bf16_compute"], ref) : weights_line;
  double sum = 0;
  int64_t n = 0;
  for (size_t s = 0; s < g["sequences"].size(); ++s) {
    const auto ids = g["sequences"][s].get<std::vector<int>>();
    const ScoreResult r = e->score(ids, {}, nullptr);
    for (size_t i = 1; i < ids.size(); ++i, ++n) sum += std::fabs(*r.logprobs[i] - ref[s][i].get<double>());
  }
  const double mean = sum / static_cast<double>(n);
  std::printf("[ golden ] fp8 weights %s cuda w8a16: mean |dlogprob| %.5f, bound %.5f (%s; bf16-weights gap x 2: "
              "%.5f)\n",
              name.c_str(), mean, bound, hybrid ? "transformers bf16 w8a16 gap" : "bf16-weights gap x 2", weights_line);
  EXPECT_LE(mean, bound) << name;
}

// W8A8 (--fp8-weight-mode w8a8) against transformers' W8A8 reference (fp32
// math, each quantized Linear's input rounded to e4m3 per token or per 1x128
// group). The CUDA engine quantizes with the same rule bit for bit
// (test_fp8_linear.cpp), but from bf16 inputs (the norm, attention and
// activation outputs, and the gate|up GEMM output, are bf16, as in vLLM and
// in a bf16 transformers model): an input within a bf16 rounding of an e4m3
// midpoint takes the neighbouring code, a whole e4m3 step (2^-3 relative)
// where the fp32 reference had 2^-9 of noise. So the fp32 CPU engine's
// W8A16 line does not carry over. The line comes from transformers' own
// bf16 run of the same W8A8 algorithm on the same checkpoint (golden
// "w8a8_bf16_compute", tools/gen_fp8_weight_goldens.py --add-bf16-compute):
// the same roundings, so the same expected gap to the fp32 reference; the
// two are independent draws over 94 positions whose gaps are heavy-tailed
// (a code flip that moves the top token moves a logprob by whole units), so
// the line is 1.5 x that run's mean gap (the first H100 run's CUDA gaps were
// 0.67-1.003 of it). The Qwen3.5 hybrid's line is the same (146
// positions): its Gated DeltaNet projections quantize their inputs by the
// same rule, in the engine as in transformers' bf16 run. And W8A8 ran: the
// CUDA W8A8 logprobs differ from the CUDA W8A16 ones by at least half of
// W8A8's own effect in the goldens (mean |w8a8 - w8a16|; a silent W8A16
// fallback gives 0). Printed too: the CPU engine (fp32 inputs:
// transformers' codes) against both.
TEST_P(CudaFp8WeightGolden, W8A8WithinBf16ComputeBand) {
  FP8KV_NEED_GPU();
  namespace fs = std::filesystem;
  const std::string name = GetParam();
  const fs::path dir = fs::path(FP8KV_SOURCE_DIR) / "tests/golden/fp8_weights" / name;
  if (!fs::exists(dir / "golden.json")) GTEST_SKIP() << "golden files missing in " << dir;
  std::ifstream in(dir / "golden.json");
  const nlohmann::json g = nlohmann::json::parse(in);
  ASSERT_TRUE(g.contains("w8a8_bf16_compute"))
      << dir << ": no w8a8_bf16_compute; run `python3 tools/gen_fp8_weight_goldens.py --add-bf16-compute`";
  auto cuda_e = load_fp8_case(dir, BackendChoice::cuda, Fp8Compute::w8a8);
  auto cpu_e = load_fp8_case(dir, BackendChoice::cpu, Fp8Compute::w8a8);
  const nlohmann::json& ref = g["w8a8"];
  const nlohmann::json& w8a16 = g["w8a16"];
  const double bound = 1.5 * mean_gap(g["w8a8_bf16_compute"], ref);
  const double effect = mean_gap(ref, w8a16);
  auto w8a16_e = load_fp8_case(dir, BackendChoice::cuda, Fp8Compute::w8a16);
  double sum = 0, sum_w8a16 = 0, sum_cpu = 0, sum_cuda_cpu = 0, sum_modes = 0;
  int64_t n = 0;
  for (size_t s = 0; s < g["sequences"].size(); ++s) {
    const auto ids = g["sequences"][s].get<std::vector<int>>();
    const ScoreResult rc = cuda_e->score(ids, {}, nullptr);
    const ScoreResult rp = cpu_e->score(ids, {}, nullptr);
    const ScoreResult r16 = w8a16_e->score(ids, {}, nullptr);
    for (size_t i = 1; i < ids.size(); ++i, ++n) {
      sum += std::fabs(*rc.logprobs[i] - ref[s][i].get<double>());
      sum_modes += std::fabs(*rc.logprobs[i] - *r16.logprobs[i]);
      sum_w8a16 += std::fabs(*rc.logprobs[i] - w8a16[s][i].get<double>());
      sum_cpu += std::fabs(*rp.logprobs[i] - ref[s][i].get<double>());
      sum_cuda_cpu += std::fabs(*rc.logprobs[i] - *rp.logprobs[i]);
    }
  }
  const double dn = static_cast<double>(n);
  const double mean = sum / dn, modes = sum_modes / dn;
  std::printf("[ golden ] fp8 weights %s w8a8: mean |dlogprob| cuda vs transformers w8a8 %.5f, bound %.5f "
              "(transformers bf16 w8a8 gap x 1.5); cuda w8a8 vs cuda w8a16 %.5f (>= %.5f); cuda vs w8a16 %.5f; "
              "cpu vs w8a8 %.5f; cuda vs cpu %.5f; W8A8's own effect (golden w8a8 vs w8a16) %.5f\n",
              name.c_str(), mean, bound, modes, 0.5 * effect, sum_w8a16 / dn, sum_cpu / dn, sum_cuda_cpu / dn,
              effect);
  RecordProperty("mean_abs_dlogprob_cuda_vs_w8a8", std::to_string(mean));
  EXPECT_LE(mean, bound) << name;
  EXPECT_GE(modes, 0.5 * effect) << name << ": CUDA W8A8 is (nearly) CUDA W8A16";
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaFp8WeightGolden,
                         ::testing::Values("llama_block", "llama_ct_channel", "llama_ct_tensor", "llama_modelopt",
                                           "qwen3_block", "qwen3_ct_channel", "qwen3_ct_tensor", "qwen3_modelopt",
                                           "qwen3_5_block", "fp8kv_mini_block"));

}  // namespace
}  // namespace fp8kv
