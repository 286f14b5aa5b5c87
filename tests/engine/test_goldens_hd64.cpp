// The CPU engine against transformers on the head_dim 64 / 256 checkpoints
// (tests/golden/models_hd64, tools/gen_model_goldens_hd64.py), the shapes the
// CUDA kernels take. The comparison (hf_golden.h) takes the backend as a
// parameter so that the CUDA backend reuses these goldens.
#include <gtest/gtest.h>

#include "hf_golden.h"

namespace fp8kv {
namespace {

class GoldenHd64 : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GoldenHd64, CpuMatchesTransformers) {
  const auto [name, variant] = GetParam();
  const testing::GoldenOutcome r = testing::check_hf_golden(name, variant, BackendChoice::cpu);
  // Flips at layer 0 sit on rounding boundaries: rare (well under 1% of the
  // 2 x T x kv_heads x head_dim elements per sequence).
  EXPECT_LT(r.flips, 2 * 112 * 256 / 100) << name << " " << variant;
  RecordProperty("mean_abs_dlogprob", std::to_string(r.mean_abs_vs_variant));
}

INSTANTIATE_TEST_SUITE_P(All, GoldenHd64,
                         ::testing::Combine(::testing::Values("llama", "mistral", "qwen2", "qwen3", "gemma3"),
                                            ::testing::Values("fp32", "bf16", "fp8_e4m3", "fp8_e5m2")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// The goldens themselves: transformers' own bf16 run is further from fp32
// than a bf16 KV cache alone (all activations vs K/V only), which makes it a
// meaningful tolerance basis for a bf16-GEMM backend.
TEST(GoldenHd64Files, HfBf16GapIsRecordedAndPlausible) {
  for (const char* name : {"llama", "mistral", "qwen2", "qwen3", "gemma3"}) {
    std::ifstream in(testing::hd64_golden_dir(name) / "golden.json");
    ASSERT_TRUE(in) << name;
    const auto g = nlohmann::json::parse(in);
    const double gap = g["hf_bf16_gap"]["mean_abs"].get<double>();
    EXPECT_GT(gap, 0.0) << name;
    EXPECT_LT(gap, 0.1) << name;
    EXPECT_GT(gap, testing::variant_gap(g, "bf16", "fp32")) << name;  // a bf16 KV cache alone
  }
}

// kv_layer0_bounds (the CUDA goldens' layer-0 K/V bound) reads the
// checkpoint once per directory: the second call takes the cached tensors,
// and a batch of ids gives each id's rows as when asked alone.
TEST(GoldenHd64Files, Layer0BoundsCachedPerCheckpoint) {
  const auto dir = testing::hd64_golden_dir("llama");
  const ModelConfig c = load_model_config(dir);
  const testing::Layer0Tensors& a = testing::layer0_tensors(dir, c);
  ASSERT_TRUE(a.ok);
  EXPECT_EQ(&a, &testing::layer0_tensors(dir / "." , c));  // same checkpoint, same entry
  const testing::KvBounds all = testing::kv_layer0_bounds(dir, c, {5, 17, 5});
  ASSERT_EQ(all.k.size(), 3u);
  ASSERT_EQ(all.v.size(), 3u);
  EXPECT_EQ(all.k[0], all.k[2]);
  for (int i : {0, 1}) {
    const testing::KvBounds one = testing::kv_layer0_bounds(dir, c, {i == 0 ? 5 : 17});
    EXPECT_EQ(one.k[0], all.k[i]);
    EXPECT_EQ(one.v[0], all.v[i]);
  }
  for (double b : all.k[1]) EXPECT_TRUE(b > 0 && std::isfinite(b));
  // Families the bound does not cover: empty (the caller keeps its fixed bound).
  EXPECT_TRUE(testing::kv_layer0_bounds(testing::hd64_golden_dir("qwen3"),
                                        load_model_config(testing::hd64_golden_dir("qwen3")), {5})
                  .k.empty());
}

}  // namespace
}  // namespace fp8kv
