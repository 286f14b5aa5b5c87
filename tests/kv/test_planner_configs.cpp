// The planner on the published configs under tests/data/configs, parsed by
// load_model_config: the group structure each family gets and bytes/token
// against hand arithmetic.
#include <gtest/gtest.h>

#include <string>

#include "kv/planner.h"
#include "model/config.h"

namespace fp8kv {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

ModelConfig load(const std::string& name) {
  return load_model_config(std::string(FP8KV_SOURCE_DIR) + "/tests/data/configs/" + name);
}

KvPlan plan(const ModelConfig& c, KvDtype d, uint64_t mem = 80 * kGiB) {
  KvPlanSettings s;
  s.kv_memory_bytes = mem;
  s.dtype = d;
  s.max_num_batched_tokens = 2048;  // the hand arithmetic below was done at 2048 (the default is now 8192)
  return plan_kv_cache(c, s);
}

TEST(PlannerConfigs, Llama31_8B) {
  const ModelConfig c = load("llama-3.1-8b");
  const KvPlan b = plan(c, KvDtype::bf16), f = plan(c, KvDtype::fp8_e4m3);
  EXPECT_EQ(b.bytes_per_token, 32u * 8 * 128 * 2 * 2);  // 131072
  EXPECT_EQ(f.bytes_per_token, 65536u);
  EXPECT_EQ(b.max_model_len, 131072);  // llama3 rope: max_position_embeddings already extended
  ASSERT_EQ(b.groups.size(), 1u);
  EXPECT_EQ(b.num_blocks, 40960);
  EXPECT_EQ(f.num_blocks, 81920);
  EXPECT_EQ(b.tokens, 655360);
}

TEST(PlannerConfigs, Qwen3_8B_NoSlidingWindow) {
  // use_sliding_window false: every layer is full attention.
  const ModelConfig c = load("qwen3-8b");
  const KvPlan b = plan(c, KvDtype::bf16);
  ASSERT_EQ(b.groups.size(), 1u);
  EXPECT_EQ(b.groups[0].window, 0);
  EXPECT_EQ(b.groups[0].layers.size(), 36u);
  EXPECT_EQ(b.bytes_per_token, 36u * 8 * 128 * 2 * 2);  // 147456
  EXPECT_EQ(b.max_model_len, 40960);
  EXPECT_EQ(b.blocks_per_request, 2560);
  // page = 16 x 147456 = 2359296 B; 80 GiB / page = 36408 (floor)
  EXPECT_EQ(b.page_bytes, 2359296u);
  EXPECT_EQ(b.num_blocks, static_cast<int64_t>(80 * kGiB / 2359296));
  EXPECT_EQ(b.tokens, b.num_blocks * 16);
  const KvPlan f = plan(c, KvDtype::fp8_e4m3);
  EXPECT_TRUE(f.num_blocks == 2 * b.num_blocks || f.num_blocks == 2 * b.num_blocks + 1);
}

TEST(PlannerConfigs, Mistral7B_AllLayersSlide) {
  const ModelConfig c = load("mistral-7b-v0.1");
  const KvPlan b = plan(c, KvDtype::bf16, 16 * kGiB);
  ASSERT_EQ(b.groups.size(), 1u);
  EXPECT_EQ(b.groups[0].window, 4096);
  EXPECT_EQ(b.groups[0].layers.size(), 32u);
  EXPECT_EQ(b.bytes_per_token, 131072u);
  // min(4095 + 2048, 32768) = 6143 -> cdiv(6143, 16) + 1 = 385 blocks per request
  EXPECT_EQ(b.blocks_per_request, 385);
  EXPECT_EQ(b.num_blocks, 8192);
  EXPECT_EQ(b.tokens, 8192LL * 32768 / 385);
}

TEST(PlannerConfigs, Gemma3_12B_Hybrid) {
  const ModelConfig c = load("gemma-3-12b");
  const KvPlan b = plan(c, KvDtype::bf16);
  // gemma3: max_position_embeddings already includes the linear rope factor 8.
  EXPECT_EQ(b.max_model_len, 131072);
  EXPECT_EQ(b.group_size, 8);
  ASSERT_EQ(b.groups.size(), 6u);
  for (int g = 0; g < 5; ++g) {
    EXPECT_EQ(b.groups[static_cast<size_t>(g)].window, 1024);
    EXPECT_EQ(b.groups[static_cast<size_t>(g)].blocks_per_request, 193);
  }
  EXPECT_EQ(b.groups[5].window, 0);
  EXPECT_EQ(b.groups[5].layers, (std::vector<int>{5, 11, 17, 23, 29, 35, 41, 47}));
  EXPECT_EQ(b.bytes_per_token, 48u * 8 * 256 * 2 * 2);  // 393216
  EXPECT_EQ(b.page_bytes, 1u << 20);
  EXPECT_EQ(b.blocks_per_request, 9157);
  EXPECT_EQ(b.tokens, 1172591);
  const KvPlan f = plan(c, KvDtype::fp8_e4m3);
  EXPECT_EQ(f.num_blocks, 2 * b.num_blocks);
}

TEST(PlannerConfigs, Gemma3_12B_AtTheEngineDefault8192BatchedTokens) {
  // The default both the engine and `fp8kv capacity` use: the sliding groups
  // reserve min(1023 + 8192, 131072) = 9215 tokens -> cdiv(9215, 16) + 1 = 577.
  KvPlanSettings s;
  s.kv_memory_bytes = 80 * kGiB;
  const KvPlan b = plan_kv_cache(load("gemma-3-12b"), s);
  EXPECT_EQ(b.max_num_batched_tokens, 8192);
  EXPECT_EQ(b.groups[0].blocks_per_request, 577);
  EXPECT_EQ(b.blocks_per_request, 8192 + 5 * 577);  // 11077
  EXPECT_EQ(b.tokens, 81920LL * 131072 / 11077);    // 969343
}

TEST(PlannerConfigs, Llama31_8B_WeightEstimateIsThePublishedParameterCount) {
  const ModelConfig c = load("llama-3.1-8b");
  EXPECT_EQ(estimate_parameters(c), 8030261248ull);
  EXPECT_EQ(estimate_weight_bytes(c), 2 * 8030261248ull);  // bfloat16
  EXPECT_EQ(weights_per_rank(estimate_weight_bytes(c), 2), 8030261248ull);
}

}  // namespace
}  // namespace fp8kv
