// Capacity planner against hand arithmetic (docs/capacity.md). Configs are
// built directly (published architectures); the config.json files under
// tests/data/configs are checked in test_planner_configs.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>

#include "../common/errors.h"
#include "io/errors.h"
#include "kv/planner.h"

namespace fp8kv {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t GiB = 1ull << 30;
constexpr uint64_t MiB = 1ull << 20;

ModelConfig dense(int layers, int heads, int kv_heads, int head_dim, int max_pos) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.hidden_size = heads * head_dim;
  c.max_position_embeddings = max_pos;
  c.layer_types.assign(static_cast<size_t>(layers), LayerType::full_attention);
  return c;
}

ModelConfig llama31_8b() { return dense(32, 32, 8, 128, 131072); }

// Gemma-3-12B text: 48 layers, every 6th (5, 11, ..., 47) full, window 1024.
ModelConfig gemma3_12b() {
  ModelConfig c = dense(48, 16, 8, 256, 131072);
  c.model_type = "gemma3_text";
  c.sliding_window = 1024;
  for (int i = 0; i < 48; ++i)
    c.layer_types[static_cast<size_t>(i)] =
        (i + 1) % 6 == 0 ? LayerType::full_attention : LayerType::sliding_attention;
  return c;
}

// Mistral-7B-v0.1: every layer slides with window 4096.
ModelConfig mistral_7b() {
  ModelConfig c = dense(32, 32, 8, 128, 32768);
  c.sliding_window = 4096;
  c.layer_types.assign(32, LayerType::sliding_attention);
  return c;
}

KvPlanSettings settings(uint64_t mem, KvDtype d = KvDtype::bf16) {
  KvPlanSettings s;
  s.kv_memory_bytes = mem;
  s.dtype = d;
  // The hand arithmetic below was written for 2048 batched tokens (vLLM's
  // old default); the default is now the engine's 8192 (Planner.Defaults...).
  s.max_num_batched_tokens = 2048;
  return s;
}

TEST(Planner, Llama31DenseBf16HandArithmetic) {
  const KvPlan p = plan_kv_cache(llama31_8b(), settings(80 * GiB));
  // 32 layers x 8 kv heads x 128 dims x (K+V) x 2 bytes
  EXPECT_EQ(p.bytes_per_token, 131072u);
  EXPECT_EQ(p.kv_heads_per_rank, 8);
  EXPECT_EQ(p.group_size, 32);
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_EQ(p.groups[0].type, LayerType::full_attention);
  EXPECT_EQ(p.groups[0].layers.size(), 32u);
  EXPECT_EQ(p.groups[0].bytes_per_token, 131072u);
  // page: 16 tokens x 131072 B = 2 MiB; 80 GiB / 2 MiB = 40960 blocks
  EXPECT_EQ(p.layer_block_bytes, 16u * 8 * 128 * 2);
  EXPECT_EQ(p.page_bytes, 2 * MiB);
  EXPECT_EQ(p.num_blocks, 40960);
  EXPECT_EQ(p.max_model_len, 131072);  // default: max_position_embeddings
  EXPECT_EQ(p.blocks_per_request, 8192);
  EXPECT_DOUBLE_EQ(p.max_concurrency, 5.0);
  EXPECT_EQ(p.tokens, 40960 * 16);
  EXPECT_EQ(p.vllm_logged_tokens, 40960 * 16);
  EXPECT_EQ(p.pool_bytes(), 80 * GiB);
}

TEST(Planner, DenseFp8HoldsExactlyTwiceTheBf16Blocks) {
  for (auto fp8 : {KvDtype::fp8_e4m3, KvDtype::fp8_e5m2}) {
    // Memory a multiple of the bf16 page: exactly 2n.
    const KvPlan b = plan_kv_cache(llama31_8b(), settings(80 * GiB));
    const KvPlan f = plan_kv_cache(llama31_8b(), settings(80 * GiB, fp8));
    EXPECT_EQ(f.bytes_per_token, 65536u);
    EXPECT_EQ(f.page_bytes, 1 * MiB);
    EXPECT_EQ(f.num_blocks, 2 * b.num_blocks);
    EXPECT_EQ(f.tokens, 2 * b.tokens);
    EXPECT_DOUBLE_EQ(f.max_concurrency, 10.0);
    // Half a bf16 page more: the fp8 pool gets one extra block (2n + 1).
    const KvPlan b2 = plan_kv_cache(llama31_8b(), settings(80 * GiB + 1 * MiB));
    const KvPlan f2 = plan_kv_cache(llama31_8b(), settings(80 * GiB + 1 * MiB, fp8));
    EXPECT_EQ(b2.num_blocks, 40960);
    EXPECT_EQ(f2.num_blocks, 2 * b2.num_blocks + 1);
    // One byte short of a page: both floor.
    const KvPlan f3 = plan_kv_cache(llama31_8b(), settings(80 * GiB - 1, fp8));
    EXPECT_EQ(f3.num_blocks, 81919);
  }
}

TEST(Planner, TokensAreFloorOfConcurrencyTimesMaxModelLen) {
  KvPlanSettings s = settings(80 * GiB);
  s.max_model_len = 1000;  // not a multiple of 16: 63 blocks per request
  const KvPlan p = plan_kv_cache(llama31_8b(), s);
  EXPECT_EQ(p.blocks_per_request, 63);
  EXPECT_DOUBLE_EQ(p.max_concurrency, 40960.0 / 63.0);
  EXPECT_EQ(p.tokens, 650158);  // floor(40960 * 1000 / 63)
  EXPECT_EQ(p.vllm_logged_tokens, 40960 * 16);  // vLLM's log line counts blocks instead
}

TEST(Planner, Gemma3HybridGroups) {
  const KvPlan p = plan_kv_cache(gemma3_12b(), settings(80 * GiB));
  // 40 sliding + 8 full: group size min(40, 8) = 8 (40 >= 1.5 x 8).
  EXPECT_EQ(p.group_size, 8);
  ASSERT_EQ(p.groups.size(), 6u);
  // Sliding comes first (layer 0 slides); group g = sliding layers [g::5] = {6k + g}.
  for (int g = 0; g < 5; ++g) {
    EXPECT_EQ(p.groups[static_cast<size_t>(g)].type, LayerType::sliding_attention);
    EXPECT_EQ(p.groups[static_cast<size_t>(g)].window, 1024);
    std::vector<int> want;
    for (int k = 0; k < 8; ++k) want.push_back(6 * k + g);
    EXPECT_EQ(p.groups[static_cast<size_t>(g)].layers, want) << "group " << g;
    // min(1023 + 2048, 131072) = 3071 tokens -> cdiv(3071, 16) + 1 = 193
    EXPECT_EQ(p.groups[static_cast<size_t>(g)].blocks_per_request, 193);
  }
  EXPECT_EQ(p.groups[5].type, LayerType::full_attention);
  EXPECT_THAT(p.groups[5].layers, ElementsAre(5, 11, 17, 23, 29, 35, 41, 47));
  EXPECT_EQ(p.groups[5].blocks_per_request, 8192);
  EXPECT_EQ(p.blocks_per_request, 8192 + 5 * 193);
  // page: 16 tokens x 8 layers x 2 x 8 heads x 256 x 2 B = 1 MiB
  EXPECT_EQ(p.page_bytes, 1 * MiB);
  EXPECT_EQ(p.num_blocks, 81920);
  EXPECT_EQ(p.bytes_per_token, 48u * 2 * 8 * 256 * 2);
  EXPECT_EQ(p.groups[0].bytes_per_token, 8u * 2 * 8 * 256 * 2);
  EXPECT_DOUBLE_EQ(p.max_concurrency, 81920.0 / 9157.0);
  EXPECT_EQ(p.tokens, 1172591);  // floor(81920 * 131072 / 9157)
  EXPECT_EQ(p.vllm_logged_tokens, 81920 / 6 * 16);

  const KvPlan f = plan_kv_cache(gemma3_12b(), settings(80 * GiB, KvDtype::fp8_e4m3));
  EXPECT_EQ(f.num_blocks, 163840);
  EXPECT_EQ(f.tokens, 2345182);  // floor(163840 * 131072 / 9157)
}

TEST(Planner, SlidingBlocksFollowBatchedTokensAndCapAtMaxModelLen) {
  KvPlanSettings s = settings(80 * GiB);
  s.max_num_batched_tokens = 8192;
  s.max_model_len = 32768;
  KvPlan p = plan_kv_cache(gemma3_12b(), s);
  // min(1023 + 8192, 32768) = 9215 -> cdiv(9215, 16) + 1 = 577
  EXPECT_EQ(p.groups[0].blocks_per_request, 577);
  EXPECT_EQ(p.groups[5].blocks_per_request, 2048);
  EXPECT_EQ(p.blocks_per_request, 2048 + 5 * 577);

  s.max_num_batched_tokens = 2048;
  s.max_model_len = 512;  // shorter than the window: min(3071, 512) = 512 -> 32 + 1
  p = plan_kv_cache(gemma3_12b(), s);
  EXPECT_EQ(p.groups[0].blocks_per_request, 33);
  EXPECT_EQ(p.groups[5].blocks_per_request, 32);
  EXPECT_EQ(p.blocks_per_request, 32 + 5 * 33);
}

TEST(Planner, MistralAllSlidingIsOneGroup) {
  const KvPlan p = plan_kv_cache(mistral_7b(), settings(16 * GiB));
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_EQ(p.group_size, 32);
  EXPECT_EQ(p.groups[0].window, 4096);
  // min(4095 + 2048, 32768) = 6143 -> cdiv(6143, 16) + 1 = 385
  EXPECT_EQ(p.blocks_per_request, 385);
  EXPECT_EQ(p.page_bytes, 2 * MiB);
  EXPECT_EQ(p.num_blocks, 8192);
  EXPECT_EQ(p.tokens, 8192LL * 32768 / 385);
}

TEST(Planner, GroupSizeUsesMaxWhenCountsAreClose) {
  // 13 full + 12 sliding (gpt-oss-20b + drafter): 13 < 1.5 x 12 -> group size 13.
  ModelConfig c = dense(25, 8, 8, 64, 4096);
  c.sliding_window = 128;
  for (int i = 0; i < 12; ++i) c.layer_types[static_cast<size_t>(2 * i + 1)] = LayerType::sliding_attention;
  KvPlan p = plan_kv_cache(c, settings(1 * GiB));
  EXPECT_EQ(p.group_size, 13);
  ASSERT_EQ(p.groups.size(), 2u);
  EXPECT_EQ(p.groups[0].type, LayerType::full_attention);
  EXPECT_EQ(p.groups[0].layers.size(), 13u);
  EXPECT_EQ(p.groups[1].layers.size(), 12u);  // padded to 13
  EXPECT_EQ(p.page_bytes, 16u * 13 * 2 * 8 * 64 * 2);

  // 20 full + 30 sliding: 30 is not < 30 -> group size 20; sliding splits
  // strided into 2 groups of 15: [0::2] and [1::2] of the sliding layers.
  ModelConfig d = dense(50, 8, 8, 64, 4096);
  d.sliding_window = 128;
  std::vector<int> sliding;
  for (int i = 0; i < 50; ++i)
    if (i % 5 >= 2) {
      d.layer_types[static_cast<size_t>(i)] = LayerType::sliding_attention;
      sliding.push_back(i);
    }
  ASSERT_EQ(sliding.size(), 30u);
  p = plan_kv_cache(d, settings(1 * GiB));
  EXPECT_EQ(p.group_size, 20);
  ASSERT_EQ(p.groups.size(), 3u);
  EXPECT_EQ(p.groups[0].type, LayerType::full_attention);  // layer 0 is full
  std::vector<int> even, odd;
  for (size_t i = 0; i < sliding.size(); ++i) (i % 2 ? odd : even).push_back(sliding[i]);
  EXPECT_EQ(p.groups[1].layers, even);
  EXPECT_EQ(p.groups[2].layers, odd);
}

TEST(Planner, TensorParallelHeadsPerRank) {
  KvPlanSettings s = settings(40 * GiB);
  s.tensor_parallel_size = 2;
  KvPlan p = plan_kv_cache(llama31_8b(), s);
  EXPECT_EQ(p.kv_heads_per_rank, 4);
  EXPECT_EQ(p.bytes_per_token, 65536u);
  EXPECT_EQ(p.num_blocks, 40960);  // half the bytes per rank, half the memory

  // tp 16 > 8 kv heads: each head replicated on 2 ranks, 1 head per rank.
  EXPECT_EQ(kv_heads_per_rank(llama31_8b(), 16), 1);
  EXPECT_EQ(kv_heads_per_rank(llama31_8b(), 8), 1);
  EXPECT_THAT(test_util::input_error_of([&] { kv_heads_per_rank(llama31_8b(), 3); }),
              HasSubstr("does not divide num_attention_heads 32"));
  ModelConfig c = dense(4, 12, 4, 64, 4096);
  // 12 % 6 == 0 but 6 > 4 kv heads is not a multiple of 4
  EXPECT_THAT(test_util::input_error_of([&] { kv_heads_per_rank(c, 6); }), HasSubstr("multiple"));
  ModelConfig d = dense(4, 12, 6, 64, 4096);
  EXPECT_THROW(kv_heads_per_rank(d, 4), InputError);  // 6 % 4 != 0
  EXPECT_EQ(kv_heads_per_rank(d, 3), 2);
}

TEST(Planner, TooLittleMemorySaysWhatFits) {
  // bf16, max_model_len 131072 needs 8192 x 2 MiB = 16 GiB; 10 GiB holds
  // 5120 blocks = 81920 tokens.
  EXPECT_THAT(test_util::input_error_of([&] { plan_kv_cache(llama31_8b(), settings(10 * GiB)); }),
              AllOf(HasSubstr("17179869184 bytes"), HasSubstr("largest max_model_len that fits is 81920")));
  EXPECT_EQ(kv_memory_needed(llama31_8b(), settings(0)), 16 * GiB);
  EXPECT_EQ(max_model_len_that_fits(llama31_8b(), settings(10 * GiB)), 81920);
  EXPECT_EQ(max_model_len_that_fits(llama31_8b(), settings(10 * GiB + 2 * MiB - 1)), 81920);
  EXPECT_EQ(max_model_len_that_fits(llama31_8b(), settings(10 * GiB + 2 * MiB)), 81936);
  EXPECT_EQ(max_model_len_that_fits(llama31_8b(), settings(2 * MiB - 1)), 0);
  // Exactly enough memory works (concurrency 1).
  const KvPlan p = plan_kv_cache(llama31_8b(), settings(16 * GiB));
  EXPECT_DOUBLE_EQ(p.max_concurrency, 1.0);
  // Hybrid: the max length that fits counts every group.
  KvPlanSettings s = settings(9157 * MiB);  // gemma page 1 MiB: exactly one request
  EXPECT_EQ(max_model_len_that_fits(gemma3_12b(), s), 131072);
  s.kv_memory_bytes = 9156 * MiB;
  EXPECT_THROW(plan_kv_cache(gemma3_12b(), s), InputError);
  EXPECT_EQ(max_model_len_that_fits(gemma3_12b(), s), 131072 - 16);
  EXPECT_THAT(test_util::input_error_of([&] { plan_kv_cache(llama31_8b(), settings(1000)); }),
              HasSubstr("not even a 1-token request fits"));
}

TEST(Planner, BadSettingsAreInputErrors) {
  KvPlanSettings s = settings(80 * GiB);
  s.max_model_len = 131073;
  EXPECT_THAT(test_util::input_error_of([&] { plan_kv_cache(llama31_8b(), s); }), HasSubstr("use at most 131072"));
  s = settings(80 * GiB);
  s.block_size = 0;
  EXPECT_THROW(plan_kv_cache(llama31_8b(), s), InputError);
  s = settings(80 * GiB);
  s.max_num_batched_tokens = 0;
  EXPECT_THROW(plan_kv_cache(llama31_8b(), s), InputError);
  s = settings(80 * GiB);
  s.tensor_parallel_size = 0;
  EXPECT_THROW(plan_kv_cache(llama31_8b(), s), InputError);
  ModelConfig c = llama31_8b();
  c.layer_types.pop_back();
  EXPECT_THROW(plan_kv_cache(c, settings(80 * GiB)), InputError);
  ModelConfig g = gemma3_12b();
  g.sliding_window.reset();
  EXPECT_THROW(plan_kv_cache(g, settings(80 * GiB)), InputError);
}

TEST(Planner, RopeScalingExtendsTheMaxLength) {
  ModelConfig c = dense(4, 4, 4, 64, 32768);
  EXPECT_EQ(model_max_len(c), 32768);
  c.rope_full.type = "yarn";
  c.rope_full.factor = 4.0;
  c.rope_full.original_max_position_embeddings = 32768;
  EXPECT_EQ(model_max_len(c), 131072);
  c.rope_full.type = "llama3";  // llama3 already states the extended length
  EXPECT_EQ(model_max_len(c), 32768);
}

TEST(Planner, LogLine) {
  // A hybrid: blocks x 16 is not the tokens, so the line gives the arithmetic
  // (issue 37): 163840 / (8192 + 5 x 193) = 17.89 requests of 131072 tokens.
  const KvPlan p = plan_kv_cache(gemma3_12b(), settings(80 * GiB, KvDtype::fp8_e4m3));
  EXPECT_EQ(kv_plan_log_line(p),
            "KV cache: 2345182 tokens = max concurrency 17.89x at max_model_len 131072 (pool: 163840 blocks of 16 "
            "tokens shared by 6 KV-cache groups of 8 layers; a request of max_model_len takes 8192 in full attention + "
            "5 x 193 in sliding window 1024 = 9157 blocks), dtype fp8_e4m3");
  // Every layer sliding: one group.
  const KvPlan m = plan_kv_cache(mistral_7b(), settings(80 * GiB));
  EXPECT_THAT(kv_plan_log_line(m), HasSubstr("blocks of 16 tokens in 1 KV-cache group of 32 layers; a request of "
                                             "max_model_len takes " +
                                             std::to_string(m.blocks_per_request) + " blocks in sliding window 4096)"));
  // Dense: blocks x block_size = tokens, the plain line.
  const KvPlan d = plan_kv_cache(llama31_8b(), settings(80 * GiB));
  EXPECT_EQ(kv_plan_log_line(d), fmt::format("KV cache: {} tokens ({} blocks of 16), max concurrency {:.2f}x at "
                                             "max_model_len 131072, dtype bf16",
                                             d.num_blocks * 16, d.num_blocks, d.max_concurrency));
}

TEST(ParseSize, UnitsAndErrors) {
  EXPECT_EQ(parse_size("80GiB"), 80 * GiB);
  EXPECT_EQ(parse_size("512MiB"), 512 * MiB);
  EXPECT_EQ(parse_size("80GB"), 80000000000ull);
  EXPECT_EQ(parse_size("80gb"), 80000000000ull);
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("4096B"), 4096u);
  EXPECT_EQ(parse_size(" 2 GiB "), 2 * GiB);
  EXPECT_EQ(parse_size("1.5GiB"), 1610612736u);
  EXPECT_EQ(parse_size("1KiB"), 1024u);
  EXPECT_EQ(parse_size("1KB"), 1000u);
  EXPECT_EQ(parse_size("1TiB"), 1ull << 40);
  EXPECT_EQ(parse_size("0"), 0u);
  for (const char* bad : {"", "GiB", "-1GiB", "-5", "80G", "80XB", "80 GiB extra", "1.5", "0.1KB1",
                          "99999999999999999999999GiB", "16777216TiB", "abc"}) {
    EXPECT_THROW(parse_size(bad), InputError) << bad;
  }
  EXPECT_THAT(test_util::input_error_of([&] { parse_size("80XB"); }), HasSubstr("unknown unit 'xb'"));
  EXPECT_THAT(test_util::input_error_of([&] { parse_size("-1GiB"); }), HasSubstr("negative"));
}

TEST(Planner, DefaultsAreTheEngineFlagDefaults) {
  // cli/engine_flags.h and `fp8kv capacity` start from these (vLLM's defaults).
  const KvPlanSettings s;
  EXPECT_EQ(s.max_num_batched_tokens, 8192);
  EXPECT_EQ(s.max_num_seqs, 256);
  EXPECT_EQ(s.block_size, 16);
  EXPECT_EQ(kDefaultGpuMemoryUtilization, 0.9);
}

// Issue 15 item 1: 64 layers x 1024 KV heads x head_dim 65536 with block size
// 2^30 made the page product exactly 2^64, which wrapped to 0 and divided by
// zero (SIGFPE). Every product is checked now and the error names the factors.
TEST(PlannerOverflow, PageProductWrappingToZeroIsRefusedNamingTheFactors) {
  ModelConfig c = dense(64, 1024, 1024, 65536, 131072);
  KvPlanSettings s = settings(80 * GiB);
  s.block_size = 1073741824;
  EXPECT_THAT(test_util::input_error_of([&] { plan_kv_cache(c, s); }),
              AllOf(HasSubstr("does not fit in 64 bits"),
                    HasSubstr("--block-size 1073741824"),
                    HasSubstr("num_key_value_heads 1024"),
                    HasSubstr("head_dim 65536")));
  EXPECT_THROW(kv_memory_needed(c, s), InputError);
  EXPECT_THROW(max_model_len_that_fits(c, s), InputError);
  // A product wrapping to a small non-zero value (65 layers: 2^64 + 2^58 ->
  // 2^58) once planned tokens for a model that cannot hold one: refused too.
  ModelConfig d = dense(65, 1024, 1024, 65536, 131072);
  EXPECT_THROW(plan_kv_cache(d, s), InputError);
  // bytes per token alone overflowing (no --block-size involved).
  // 16384 layers x 2 x 2^20 KV heads x head_dim 2^30 x 2 B = 2^66 bytes a token.
  ModelConfig e = dense(16384, 8, 8, 128, 4096);
  e.num_heads = e.num_kv_heads = 1 << 20;
  e.head_dim = 1 << 30;
  s.block_size = 16;
  EXPECT_THAT(test_util::input_error_of([&] { plan_kv_cache(e, s); }), HasSubstr("num_hidden_layers 16384"));
}

TEST(PlannerOverflow, OneRequestLargerThan64BitsIsRefused) {
  // page = 16 x 2 x 32 x 1024 x 65536 x 2 B = 2^37; 2^31 - 1 tokens need
  // 2^27 blocks: 2^64 bytes for one request.
  ModelConfig c = dense(32, 1024, 1024, 65536, 2147483647);
  const KvPlanSettings s = settings(80 * GiB);
  EXPECT_THAT(test_util::input_error_of([&] { kv_memory_needed(c, s); }),
              HasSubstr("one request of max_model_len does not fit in 64 bits"));
  EXPECT_THROW(plan_kv_cache(c, s), InputError);
}

// Issue 15 item 10: `--kv-memory 1000000TiB` reached BlockPool ("bad number
// of blocks"); block ids are int32, so the planner refuses naming the budget.
TEST(PlannerOverflow, MoreBlocksThanInt32NamesTheBudgetFlag) {
  KvPlanSettings s = settings(parse_size("1000000TiB"));
  EXPECT_THAT(test_util::input_error_of([&] { plan_kv_cache(llama31_8b(), s); }),
              AllOf(HasSubstr("--kv-memory"), HasSubstr("32-bit"), HasSubstr("2147483647 blocks")));
  s.budget_source = "--gpu-memory";
  EXPECT_THAT(test_util::input_error_of([&] { plan_kv_cache(llama31_8b(), s); }), HasSubstr("lower --gpu-memory"));
  // The largest budget that is accepted: exactly 2^31 - 1 pages.
  s = settings(2147483647ull * 2 * MiB);
  EXPECT_EQ(plan_kv_cache(llama31_8b(), s).num_blocks, 2147483647);
}

TEST(PlannerBudget, GpuBudgetIsUtilizationMinusWeightsAndActivations) {
  GpuMemoryInputs in;
  in.gpu_memory_bytes = 80 * GiB;
  in.utilization = 0.9;
  in.weights_bytes_per_rank = 16 * GiB;
  in.weights_source = "estimate";
  in.activation_bytes = 1 * GiB;
  const KvBudget b = kv_budget_from_gpu(in, llama31_8b());
  // floor(80 GiB x 0.9) = 77309411328; minus 17 GiB
  EXPECT_EQ(b.kv_memory_bytes, 77309411328ull - 17 * GiB);
  EXPECT_TRUE(b.from_gpu);
  EXPECT_EQ(b.source, "--gpu-memory");
  in.weights_bytes_per_rank = 72 * GiB;
  EXPECT_THAT(test_util::input_error_of([&] { kv_budget_from_gpu(in, llama31_8b()); }),
              HasSubstr("leaves nothing for the KV cache"));
  // With a probe: one request of 131072 tokens needs 16 GiB; 20 GiB of KV
  // budget fits it, 10 GiB does not (and says what would).
  in.weights_bytes_per_rank = 16 * GiB;
  KvPlanSettings probe = settings(0);
  EXPECT_NO_THROW(kv_budget_from_gpu(in, llama31_8b(), &probe));
  in.gpu_memory_bytes = 30 * GiB;
  EXPECT_THAT(test_util::input_error_of([&] { kv_budget_from_gpu(in, llama31_8b(), &probe); }),
              HasSubstr("or a --max-model-len of at most"));
  in.utilization = 1.5;
  EXPECT_THROW(kv_budget_from_gpu(in, llama31_8b()), InputError);
  EXPECT_EQ(weights_per_rank(16 * GiB, 4), 4 * GiB);
  EXPECT_THROW(weights_per_rank(1, 0), InputError);
}

TEST(PlannerBudget, DefaultCpuBudgetIsCappedAndSaturates) {
  KvPlanSettings s = settings(0);
  // One request: 16 GiB. 256 of them capped at a quarter of 256 GiB.
  EXPECT_EQ(default_cpu_kv_budget(llama31_8b(), s, 256 * GiB).kv_memory_bytes, 64 * GiB);
  // Always at least one request, even above the cap (a quarter of 32 GiB).
  EXPECT_EQ(default_cpu_kv_budget(llama31_8b(), s, 32 * GiB).kv_memory_bytes, 16 * GiB);
  // One request above the machine's memory: refused by arithmetic, naming
  // max_model_len, where it came from, the bytes and what fits (issue 37).
  EXPECT_THAT(test_util::input_error_of([&] { default_cpu_kv_budget(llama31_8b(), s, 8 * GiB); }),
              AllOf(HasSubstr("max_model_len 131072 (the model's limit: max_position_embeddings in config.json; "
                              "--max-model-len not given) needs 16.00 GiB (17179869184 bytes)"),
                    HasSubstr("more than this machine's physical memory: 8.00 GiB (8589934592 bytes)"),
                    HasSubstr("give --max-model-len 65536 or less")));
  KvPlanSettings given = s;
  given.max_model_len = 100000;
  EXPECT_THAT(test_util::input_error_of(
                  [&] { default_cpu_kv_budget(llama31_8b(), given, 8 * GiB, "the address-space limit (ulimit -v)"); }),
              AllOf(HasSubstr("max_model_len 100000 (--max-model-len) needs"),
                    HasSubstr("more than the address-space limit (ulimit -v): 8.00 GiB")));
  s.max_num_seqs = 2;
  EXPECT_EQ(default_cpu_kv_budget(llama31_8b(), s, 0).kv_memory_bytes, 32 * GiB);
  // max_num_seqs x one request past 2^64 saturates instead of wrapping.
  ModelConfig c = dense(32, 1024, 1024, 16384, 2147483647);  // 2^62 bytes a request
  s.max_num_seqs = 256;
  const KvBudget b = default_cpu_kv_budget(c, s, 0);
  EXPECT_EQ(b.kv_memory_bytes, UINT64_MAX);
  EXPECT_EQ(b.source, "the default KV budget");
}

TEST(PlannerBudget, ActivationEstimateHandArithmetic) {
  // Llama-3.1-8B shape: hidden 4096, 32 heads, 8 KV heads, head_dim 128, intermediate 14336, vocab 128256.
  ModelConfig c = llama31_8b();
  c.intermediate_size = 14336;
  c.vocab_size = 128256;
  // 2048 x (2 x 4096 + (64 + 16) x 128 + 3 x 14336) x 2 + 256 x 128256 x 4 = 365.25 MiB
  EXPECT_EQ(estimate_activation_bytes(c, 2048, 256, 1), 2048ull * (8192 + 10240 + 43008) * 2 + 256ull * 128256 * 4);
  EXPECT_EQ(estimate_activation_bytes(c, 2048, 256, 1), 382992384ull);  // 365.25 MiB
  EXPECT_EQ(estimate_activation_bytes(c, 8192, 256, 1), 8192ull * 61440 * 2 + 256ull * 128256 * 4);
  // tp 2 halves the sharded widths, not the residual stream.
  EXPECT_EQ(estimate_activation_bytes(c, 2048, 256, 2), 2048ull * (8192 + 5120 + 21504) * 2 + 256ull * 128256 * 4);
  EXPECT_THROW(estimate_activation_bytes(c, 0, 256, 1), InputError);
  EXPECT_THROW(estimate_activation_bytes(c, 2048, -1, 1), InputError);
}

}  // namespace
}  // namespace fp8kv
