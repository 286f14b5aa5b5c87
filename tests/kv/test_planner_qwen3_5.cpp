// The planner on a Qwen3.5 hybrid: only full-attention layers hold KV; the
// per-sequence state pool (kv/state_plan.h) comes out of the budget first.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../common/errors.h"
#include "io/errors.h"
#include "kv/planner.h"
#include "model/config.h"

using namespace fp8kv;
using ::testing::HasSubstr;

namespace {

// The real models' pattern (3 linear : 1 full) at a small size.
ModelConfig hybrid() {
  return parse_model_config(nlohmann::json::parse(R"({
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "vocab_size": 1000, "max_position_embeddings": 4096, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4
  })"),
                            "config.json");
}

KvPlanSettings qwen_settings(KvDtype d, uint64_t mem) {
  KvPlanSettings s;
  s.kv_memory_bytes = mem;
  s.max_model_len = 1024;
  s.max_num_seqs = 16;
  s.block_size = 16;
  s.dtype = d;
  return s;
}

}  // namespace

TEST(PlannerQwen3_5, StatePoolIsCarvedBeforeTheBlocks) {
  const ModelConfig c = hybrid();
  const KvPlan p = plan_kv_cache(c, qwen_settings(KvDtype::bf16, 64u << 20));
  // Layers 3 and 7 are full attention: one group of both.
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_EQ(p.groups[0].layers, (std::vector<int>{3, 7}));
  EXPECT_EQ(p.bytes_per_token, 2u * 2 * 2 * 64 * 2);  // K+V x 2 layers x 2 heads x 64 x bf16
  // State per sequence: 6 layers x (conv [2*64 + 128 = 256][3] bf16 + recurrent [4][32][32] f32).
  const uint64_t per_seq = 6u * (256 * 3 * 2 + 4 * 32 * 32 * 4);
  EXPECT_EQ(p.state.bytes_per_sequence(), per_seq);
  EXPECT_EQ(p.state.pool_bytes(), 16 * per_seq);
  EXPECT_EQ(p.num_blocks, static_cast<int64_t>(((64u << 20) - 16 * per_seq) / p.page_bytes));
  // The one-request minimum includes the state pool.
  EXPECT_EQ(kv_memory_needed(c, qwen_settings(KvDtype::bf16, 0)), p.blocks_per_request * p.page_bytes + 16 * per_seq);
  EXPECT_NE(kv_plan_log_line(p).find("state pool: 16 slots x " + std::to_string(per_seq) + " bytes"),
            std::string::npos);
}

// --mamba-cache-dtype / --mamba-ssm-cache-dtype: the state pool counts
// each state at its dtype's size, and so do the one-request minimum, the
// blocks carved after it and the snapshots (a smaller state: a shorter
// automatic snapshot interval).
TEST(PlannerQwen3_5, StateDtypesSetTheStatePoolBytes) {
  const ModelConfig c = hybrid();
  uint64_t f32_f32 = 0, bf16_bf16 = 0;
  for (const StateDtype conv : {StateDtype::bf16, StateDtype::f32})
    for (const StateDtype ssm : {StateDtype::f32, StateDtype::bf16}) {
      KvPlanSettings s = qwen_settings(KvDtype::bf16, 64u << 20);
      s.conv_state_dtype = conv;
      s.ssm_state_dtype = ssm;
      const KvPlan p = plan_kv_cache(c, s);
      const uint64_t cb = conv == StateDtype::bf16 ? 2 : 4, sb = ssm == StateDtype::bf16 ? 2 : 4;
      // 6 linear layers x (conv [256][3] + recurrent [4][32][32]).
      const uint64_t per_seq = 6u * (256 * 3 * cb + 4 * 32 * 32 * sb);
      EXPECT_EQ(p.state.conv_bytes_per_layer(), 256u * 3 * cb);
      EXPECT_EQ(p.state.ssm_bytes_per_layer(), 4u * 32 * 32 * sb);
      EXPECT_EQ(p.state.bytes_per_sequence(), per_seq);
      EXPECT_EQ(p.state.pool_bytes(), 16 * per_seq);
      EXPECT_EQ(p.num_blocks, static_cast<int64_t>(((64u << 20) - 16 * per_seq) / p.page_bytes));
      s.kv_memory_bytes = 0;
      EXPECT_EQ(kv_memory_needed(c, s), p.blocks_per_request * p.page_bytes + 16 * per_seq);
      EXPECT_NE(kv_plan_log_line(p).find(fmt::format("conv {}, recurrent {}", state_dtype_name(conv),
                                                     state_dtype_name(ssm))),
                std::string::npos)
          << kv_plan_log_line(p);
      if (conv == StateDtype::f32 && ssm == StateDtype::f32) f32_f32 = per_seq;
      if (conv == StateDtype::bf16 && ssm == StateDtype::bf16) bf16_bf16 = per_seq;
    }
  EXPECT_EQ(2 * bf16_bf16, f32_f32);
  // Snapshots: a bf16 recurrent state halves most of a snapshot, so the
  // automatic interval (the least multiple of 64 tokens whose KV pages cost
  // a snapshot) does not grow.
  KvPlanSettings s = qwen_settings(KvDtype::bf16, 64u << 20);
  s.prefix_caching = true;
  const KvPlan f = plan_kv_cache(c, s);
  s.ssm_state_dtype = StateDtype::bf16;
  const KvPlan b = plan_kv_cache(c, s);
  EXPECT_LE(b.state.snapshot_interval, f.state.snapshot_interval);
  EXPECT_EQ(b.state.snapshot_pool_bytes(),
            static_cast<uint64_t>(b.state.snapshot_slots) * b.state.bytes_per_sequence());
}

TEST(PlannerQwen3_5, Fp8DoublesTheAttentionTokensNotTheStatePool) {
  const ModelConfig c = hybrid();
  const KvPlan b = plan_kv_cache(c, qwen_settings(KvDtype::bf16, 64u << 20));
  const KvPlan f = plan_kv_cache(c, qwen_settings(KvDtype::fp8_e4m3, 64u << 20));
  EXPECT_EQ(f.state.pool_bytes(), b.state.pool_bytes());
  EXPECT_EQ(f.page_bytes * 2, b.page_bytes);
  EXPECT_NEAR(static_cast<double>(f.tokens) / static_cast<double>(b.tokens), 2.0, 1e-3);
}

TEST(PlannerQwen3_5, BudgetBelowTheStatePoolIsRefusedNamingIt) {
  const ModelConfig c = hybrid();
  EXPECT_THAT(test_util::input_error_of([&] { plan_kv_cache(c, qwen_settings(KvDtype::bf16, 1000)); }),
              HasSubstr("smaller than the linear-attention state pool: --max-num-seqs 16"));
  EXPECT_EQ(max_model_len_that_fits(c, qwen_settings(KvDtype::bf16, 1000)), 0);
}

// Prefix caching's state snapshots (docs/design.md "Prefix snapshots of the
// linear-attention state"): the snapshot pool comes out of the same budget
// as the KV blocks, one snapshot per interval of blocks.
TEST(PlannerQwen3_5, SnapshotPoolSharesTheBudget) {
  const ModelConfig c = hybrid();
  KvPlanSettings s = qwen_settings(KvDtype::bf16, 64u << 20);
  const KvPlan off = plan_kv_cache(c, s);
  EXPECT_EQ(off.state.snapshot_slots, 0);
  EXPECT_EQ(off.state.snapshot_interval, 0);
  s.prefix_caching = true;
  const KvPlan on = plan_kv_cache(c, s);
  const uint64_t per_seq = on.state.bytes_per_sequence();
  // Automatic interval: 64-token aligned (4 blocks of 16), and the least at
  // which a snapshot costs no more than the KV pages it covers.
  const int n = on.state.snapshot_interval;
  EXPECT_EQ(n, auto_snapshot_interval(on));
  EXPECT_EQ(n % 4, 0);
  EXPECT_GE(static_cast<uint64_t>(n) * on.page_bytes, per_seq);
  EXPECT_LT(static_cast<uint64_t>(n - 4) * on.page_bytes, per_seq);
  // Every byte accounted: running states + KV blocks + snapshots <= budget,
  // with less than one block or one snapshot left over.
  const uint64_t used = on.state.pool_bytes() + on.pool_bytes() + on.state.snapshot_pool_bytes();
  EXPECT_LE(used, 64u << 20);
  EXPECT_LT((64u << 20) - used, per_seq);
  EXPECT_GE(on.state.snapshot_slots, on.num_blocks / n);  // a snapshot for every interval of cached blocks
  EXPECT_LT(on.num_blocks, off.num_blocks);
  EXPECT_EQ(on.state.snapshot_pool_bytes(), static_cast<uint64_t>(on.state.snapshot_slots) * per_seq);
  EXPECT_NE(kv_plan_log_line(on).find(fmt::format("state snapshots (prefix caching): every {} blocks ({} tokens", n,
                                                  n * 16)),
            std::string::npos)
      << kv_plan_log_line(on);
  // An explicit interval: fewer snapshots for a longer one.
  s.state_snapshot_interval = 4 * n;
  const KvPlan sparse = plan_kv_cache(c, s);
  EXPECT_EQ(sparse.state.snapshot_interval, 4 * n);
  EXPECT_GT(sparse.num_blocks, on.num_blocks);
  EXPECT_LT(sparse.state.snapshot_slots, on.state.snapshot_slots);
  // The one-request minimum is unchanged: at that budget the blocks come
  // first and the snapshots take what is left (none here: caching is off, saying why).
  s.state_snapshot_interval = 0;
  s.kv_memory_bytes = kv_memory_needed(c, s);
  const KvPlan tight = plan_kv_cache(c, s);
  EXPECT_EQ(tight.num_blocks, tight.blocks_per_request);
  EXPECT_EQ(tight.state.snapshot_slots, 0);
  EXPECT_FALSE(tight.state.snapshots());
  EXPECT_NE(tight.prefix_caching_off_reason.find("no room for one state snapshot"), std::string::npos);
}

TEST(PlannerQwen3_5, SnapshotIntervalBeyondMaxModelLenIsRefusedNamingTheFlag) {
  const ModelConfig c = hybrid();
  KvPlanSettings s = qwen_settings(KvDtype::bf16, 64u << 20);
  s.prefix_caching = true;
  s.state_snapshot_interval = 64;  // 64 x 16 = 1024 tokens = max_model_len
  EXPECT_THAT(test_util::input_error_of([&] { plan_kv_cache(c, s); }),
              HasSubstr("--state-snapshot-interval 64 x --block-size 16 = 1024 tokens"));
  s.state_snapshot_interval = -1;
  EXPECT_THROW(plan_kv_cache(c, s), InputError);
  // Other models: the flag changes nothing.
  const ModelConfig dense = parse_model_config(nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "vocab_size": 1000, "max_position_embeddings": 4096
  })"),
                                               "config.json");
  s.state_snapshot_interval = 4;
  const KvPlan d = plan_kv_cache(dense, s);
  s.prefix_caching = false;
  EXPECT_EQ(d.num_blocks, plan_kv_cache(dense, s).num_blocks);
  EXPECT_FALSE(d.state.snapshots());
}
