// Weight-set comparisons for the sharding and dummy-weight tests: every
// matrix and vector of a LayerWeights by name, and "bitwise the same".
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "engine/dummy_weights.h"
#include "engine/tp_shard.h"
#include "model/weights.h"

namespace fp8kv::testing {

using LayerMatrix = WeightMatrix LayerWeights::*;
using LayerVector = std::vector<float> LayerWeights::*;

// Every matrix of a layer (attention, MLP, Gated DeltaNet).
inline constexpr std::pair<const char*, LayerMatrix> kLayerMatrices[] = {
    {"q_proj", &LayerWeights::q_proj},       {"k_proj", &LayerWeights::k_proj},
    {"v_proj", &LayerWeights::v_proj},       {"o_proj", &LayerWeights::o_proj},
    {"gate_proj", &LayerWeights::gate_proj}, {"up_proj", &LayerWeights::up_proj},
    {"down_proj", &LayerWeights::down_proj}, {"in_proj_qkv", &LayerWeights::in_proj_qkv},
    {"in_proj_z", &LayerWeights::in_proj_z}, {"in_proj_b", &LayerWeights::in_proj_b},
    {"in_proj_a", &LayerWeights::in_proj_a}, {"out_proj", &LayerWeights::out_proj}};

// Every vector of a layer (norms, biases, Gated DeltaNet parameters).
inline constexpr std::pair<const char*, LayerVector> kLayerVectors[] = {
    {"input_norm", &LayerWeights::input_norm},
    {"q_bias", &LayerWeights::q_bias},
    {"k_bias", &LayerWeights::k_bias},
    {"v_bias", &LayerWeights::v_bias},
    {"o_bias", &LayerWeights::o_bias},
    {"q_norm", &LayerWeights::q_norm},
    {"k_norm", &LayerWeights::k_norm},
    {"post_attention_norm", &LayerWeights::post_attention_norm},
    {"pre_ffn_norm", &LayerWeights::pre_ffn_norm},
    {"post_ffn_norm", &LayerWeights::post_ffn_norm},
    {"gate_bias", &LayerWeights::gate_bias},
    {"up_bias", &LayerWeights::up_bias},
    {"down_bias", &LayerWeights::down_bias},
    {"conv1d", &LayerWeights::conv1d},
    {"A_log", &LayerWeights::A_log},
    {"dt_bias", &LayerWeights::dt_bias},
    {"gdn_norm", &LayerWeights::gdn_norm}};

// a and b are the same matrix: shape, dtype and bytes (fp8: and scales);
// two matrices without data (absent) are the same.
inline void expect_same_matrix(const WeightMatrix& a, const WeightMatrix& b, const std::string& what) {
  ASSERT_EQ(a.rows, b.rows) << what;
  ASSERT_EQ(a.cols, b.cols) << what;
  ASSERT_EQ(a.bf16, b.bf16) << what;
  ASSERT_EQ(a.fp8, b.fp8) << what;
  if (!a.data && !b.data) return;
  ASSERT_TRUE(a.data && b.data) << what;
  EXPECT_EQ(0, std::memcmp(a.data, b.data, a.bytes())) << what;
  if (a.fp8) {
    EXPECT_EQ(a.scale_granularity, b.scale_granularity) << what;
    ASSERT_TRUE(a.scales && b.scales) << what;
    EXPECT_EQ(*a.scales, *b.scales) << what;
  }
}

// Per-rank dummy weights (--load-format dummy, TP > 1:
// dummy_weights_shard) are bitwise each rank's shard of the full dummy
// model: every matrix and vector, for every rank of `world`.
inline void expect_dummy_shards_equal(const ModelConfig& cfg, int world, const std::string& tag) {
  const auto full = dummy_weights(cfg, 3);
  for (int r = 0; r < world; ++r) {
    const std::string at = tag + " world " + std::to_string(world) + " rank " + std::to_string(r);
    const auto want = shard_weights(full, cfg, TpShard{r, world});
    const auto got = dummy_weights_shard(cfg, TpShard{r, world, true}, 3);
    expect_same_matrix(got->embed, want->embed, at + " embed");
    ASSERT_EQ(got->lm_head.has_value(), want->lm_head.has_value()) << at;
    if (want->lm_head) expect_same_matrix(*got->lm_head, *want->lm_head, at + " lm_head");
    EXPECT_EQ(got->final_norm, want->final_norm) << at;
    EXPECT_EQ(got->embed_scale, want->embed_scale) << at;
    ASSERT_EQ(got->layers.size(), want->layers.size()) << at;
    for (size_t l = 0; l < want->layers.size(); ++l) {
      const LayerWeights &g = got->layers[l], &w = want->layers[l];
      const std::string al = at + " layer " + std::to_string(l);
      for (const auto& [n, m] : kLayerMatrices) expect_same_matrix(g.*m, w.*m, al + " " + n);
      for (const auto& [n, v] : kLayerVectors) EXPECT_EQ(g.*v, w.*v) << al << " " << n;
    }
  }
}

}  // namespace fp8kv::testing
