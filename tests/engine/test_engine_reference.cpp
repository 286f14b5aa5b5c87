// The engine against the naive dense reference (reference.h), for every
// family and every cache dtype, plus the engine's self-consistency
// properties (chunked == one-shot, decode == score, batch == single, thread
// count invariance).
#include <gtest/gtest.h>

#include <random>

#include "engine/engine.h"
#include "reference.h"

namespace fp8kv {
namespace {

using testing::reference_logits;
using testing::tiny_config;

std::vector<int> random_tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> t(n);
  for (auto& x : t) x = static_cast<int>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

// Non-unity scales, per tensor for K and per head for V, chosen so that the
// fp8 range is exercised (values around 1-4 land mid-range of e4m3 / 0.05).
KvScales test_scales(const ModelConfig& c) {
  KvScales s = KvScales::unity(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    s.layers[l].k.values = {0.05f + 0.01f * l};
    s.layers[l].v.values.assign(c.num_kv_heads, 0.0f);
    for (int h = 0; h < c.num_kv_heads; ++h) s.layers[l].v.values[h] = 0.02f + 0.005f * h;
  }
  return s;
}

struct Logged {
  std::vector<std::vector<float>> rows;  // [pos][V]
};

Logged run_score(Engine& e, const std::vector<int>& toks, int chunk, ScoreResult* res = nullptr) {
  Logged lg;
  ScoreOptions o;
  o.chunk_size = chunk;
  ScoreResult r = e.score(toks, o, [&](int pos, std::span<const float> l) {
    EXPECT_EQ(pos, static_cast<int>(lg.rows.size()));
    lg.rows.emplace_back(l.begin(), l.end());
  });
  if (res) *res = r;
  return lg;
}

EngineOptions small_opts(const std::string& dtype, int block_size = 4) {
  EngineOptions o;
  o.kv_cache_dtype = dtype;
  o.block_size = block_size;
  o.max_model_len = 96;
  o.kv_memory_bytes = 4u << 20;
  o.max_num_batched_tokens = 64;
  return o;
}

// Tolerance on logits, engine vs reference with the same K/V rounding
// (elements on a rounding boundary take the engine's rounding: reference.h).
// Both compute in floating point from identical weights; the engine's fp32
// dot products of length K <= 128 have relative error <= K * 2^-24 ~ 8e-6 of
// sum |a_i b_i|, which in these models stays within 10x |result|; through
// 3 layers of ~8 such ops with norms (gain ~1) that is ~3 * 8 * 8e-5 = 2e-3
// relative to the typical logit magnitude (~10 here), i.e. 2e-3 absolute on
// logits of size <= 10, which we use as: tol = 2e-4 + 2e-4 * |ref|.
struct Tol {
  double abs, rel;
};
Tol tol_for(KvDtype) { return {2e-4, 2e-4}; }

class FamilyDtype : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(FamilyDtype, MatchesDenseReferenceWithSameRounding) {
  const auto [family, dtype_name] = GetParam();
  const ModelConfig cfg = tiny_config(family);
  auto w = ModelWeights::random(cfg, 1234, 0.15f, /*bf16=*/true);
  auto eng = Engine::create(cfg, w, small_opts(dtype_name));
  const KvScales scales = kv_dtype_is_fp8(eng->kv_dtype()) ? test_scales(cfg) : KvScales::unity(cfg.num_layers);
  eng->set_kv_scales(scales);
  const auto toks = random_tokens(41, cfg.vocab_size, 7);  // crosses 4-token blocks and the 8-token windows
  ScoreResult res;
  testing::KvRecorder recorder(cfg.num_layers);
  eng->set_store_observer(&recorder);
  const Logged lg = run_score(*eng, toks, 0, &res);
  testing::RefStats st;
  const auto ref = reference_logits(cfg, *w, toks, eng->kv_dtype(), scales, true, &recorder.rec, &st);
  // The pre-rounding K/V agree to fp32 accuracy (checks projections, norms, RoPE).
  EXPECT_EQ(st.mismatched, 0) << "worst relative K/V difference " << st.worst_rel;
  EXPECT_EQ(st.elements, 2LL * cfg.num_layers * static_cast<int64_t>(toks.size()) * cfg.num_kv_heads * cfg.head_dim);
  // Boundary cases are rare: well under 1% of the elements.
  EXPECT_LT(st.flips, st.elements / 100 + 1);
  ASSERT_EQ(lg.rows.size(), toks.size());
  const Tol tol = tol_for(eng->kv_dtype());
  double worst = 0.0;
  for (size_t p = 0; p < toks.size(); ++p) {
    for (int v = 0; v < cfg.vocab_size; ++v) {
      const double err = std::abs(lg.rows[p][v] - ref[p][v]);
      worst = std::max(worst, err);
      ASSERT_LE(err, tol.abs + tol.rel * std::abs(ref[p][v])) << "pos " << p << " vocab " << v;
    }
    if (p + 1 < toks.size()) {
      const auto ls = testing::log_softmax(ref[p]);
      ASSERT_TRUE(res.logprobs[p + 1].has_value());
      EXPECT_NEAR(*res.logprobs[p + 1], ls[toks[p + 1]], 2 * (tol.abs + tol.rel * 20));
    }
  }
  EXPECT_FALSE(res.logprobs[0].has_value());
  RecordProperty("max_abs_logit_err", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(All, FamilyDtype,
                         ::testing::Combine(::testing::Values("llama", "llama_linear", "mistral", "qwen2", "qwen3",
                                                              "gemma3"),
                                            ::testing::Values("bf16", "fp8_e4m3", "fp8_e5m2")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace fp8kv
