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

#include <cstdlib>

#include "../engine/hf_golden.h"
#include "cuda_ops_util.h"

namespace fp8kv {
namespace {

class CudaGoldenHd64 : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(CudaGoldenHd64, CudaMatchesTransformers) {
  FP8KV_NEED_GPU();
  // Runs by default (skips without a GPU) since run K2 of 2026-12-01: all
  // 20 cases pass with hf_golden.h's derived layer-0 K/V bound for bf16
  // GEMMs (docs/cuda_backend.md "Run L" and the eighth session's section).
  const auto [name, variant] = GetParam();
  const testing::GoldenOutcome r = testing::check_hf_golden(name, variant, "cuda");
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
