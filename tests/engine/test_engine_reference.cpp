// The engine against the naive dense reference (reference.h), for every
// family and every cache dtype, plus the engine's self-consistency
// properties (chunked == one-shot, decode == score, batch == single, thread
// count invariance).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "engine/engine.h"
#include "reference.h"

namespace fp8kv {
namespace {

using testing::reference_logits;
using testing::logits_of;
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
                                            ::testing::Values("bf16", "fp8_e4m3", "fp8_e5m2", "fp8_per_token_head",
                                                              "int8_per_token_head")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace fp8kv

namespace fp8kv {
namespace {

using testing::tiny_config;

std::vector<int> toks_for(const ModelConfig& c, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> t(n);
  for (auto& x : t) x = static_cast<int>(rng() % static_cast<uint64_t>(c.vocab_size));
  return t;
}

double max_abs_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) m = std::max(m, static_cast<double>(std::abs(a[i][j] - b[i][j])));
  return m;
}

EngineOptions opts2(const std::string& dtype) { return testing::small_paged_options(dtype, 4u << 20, 64); }

class Consistency : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

// Chunked prefill reads the same cache values as one-shot prefill, and every
// GEMM runs with a fixed token tile (ops.cpp), attention per query in a fixed
// key order: the logits are bitwise equal.
TEST_P(Consistency, ChunkedPrefillEqualsOneShot) {
  const auto [family, dtype] = GetParam();
  const ModelConfig cfg = tiny_config(family);
  auto w = ModelWeights::random(cfg, 99, 0.15f, true);
  auto e = Engine::create(cfg, w, opts2(dtype));
  if (kv_dtype_is_fp8(e->kv_dtype())) {
    KvScales s = KvScales::unity(cfg.num_layers);
    for (auto& l : s.layers) l.k.values = {0.06f}, l.v.values = {0.03f};
    e->set_kv_scales(s);
  }
  const auto toks = toks_for(cfg, 45, 3);
  const auto one = logits_of(*e, toks, 0);
  for (int chunk : {1, 3, 5, 8, 13}) {
    const auto ch = logits_of(*e, toks, chunk);
    EXPECT_EQ(max_abs_diff(one, ch), 0.0) << "chunk " << chunk;
  }
}

// Greedy decoding, token by token, picks exactly the argmax that scoring the
// whole sequence reports at each generated position.
TEST_P(Consistency, DecodeEqualsScore) {
  const auto [family, dtype] = GetParam();
  const ModelConfig cfg = tiny_config(family);
  auto w = ModelWeights::random(cfg, 5, 0.15f, true);
  auto e = Engine::create(cfg, w, opts2(dtype));
  const auto prompt = toks_for(cfg, 6, 11);
  GenerateOptions g;
  g.max_tokens = 30;  // crosses the 8-token windows and several 4-token blocks
  g.stop_at_eos = false;
  std::vector<int> streamed;
  const GenerateResult r = e->generate(prompt, g, [&](int t) {
    streamed.push_back(t);
    return true;
  });
  ASSERT_EQ(r.tokens.size(), 30u);
  EXPECT_EQ(streamed, r.tokens);
  EXPECT_EQ(r.finish, FinishReason::length);
  std::vector<int> all = prompt;
  all.insert(all.end(), r.tokens.begin(), r.tokens.end());
  const ScoreResult s = e->score(all);
  for (size_t i = prompt.size(); i < all.size(); ++i) EXPECT_EQ(*s.top1_ids[i], all[i]) << "position " << i;
  EXPECT_EQ(e->free_kv_blocks(), e->kv_plan().num_blocks);  // everything released
}

// Mixed-length sequences scored together (interleaved prefill chunks under a
// small token budget) give exactly (bitwise) what each gives alone.
TEST_P(Consistency, BatchEqualsSingle) {
  const auto [family, dtype] = GetParam();
  const ModelConfig cfg = tiny_config(family);
  auto w = ModelWeights::random(cfg, 21, 0.15f, true);
  EngineOptions o = opts2(dtype);
  o.max_num_batched_tokens = 16;
  auto e = Engine::create(cfg, w, o);
  const std::vector<std::vector<int>> seqs = {toks_for(cfg, 37, 1), toks_for(cfg, 5, 2), toks_for(cfg, 23, 3),
                                              toks_for(cfg, 2, 4)};
  std::vector<std::vector<std::vector<float>>> batched(seqs.size());
  const auto res = e->score_batch(seqs, {}, [&](int s, int pos, std::span<const float> l) {
    ASSERT_EQ(pos, static_cast<int>(batched[s].size()));
    batched[s].emplace_back(l.begin(), l.end());
  });
  ASSERT_EQ(res.size(), seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto single = logits_of(*e, seqs[i], 0);
    EXPECT_EQ(max_abs_diff(single, batched[i]), 0.0) << "sequence " << i;
    EXPECT_EQ(res[i].token_ids, seqs[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(All, Consistency,
                         ::testing::Combine(::testing::Values("llama", "mistral", "qwen3", "gemma3"),
                                            ::testing::Values("bf16", "fp8_e4m3")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });
// The per-token-head dtypes (docs/design.md "Per-token-head KV cache dtypes"):
// a scale belongs to its slot, so chunking, decoding and batching see the
// same bytes; gemma3 has sliding layers, mistral a sliding window.
INSTANTIATE_TEST_SUITE_P(PerTokenHead, Consistency,
                         ::testing::Combine(::testing::Values("llama", "mistral", "gemma3"),
                                            ::testing::Values("fp8_per_token_head", "int8_per_token_head")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

// Results do not depend on the thread count: bitwise equal logits.
TEST(Threads, OneAndTwoThreadsBitwiseEqual) {
  for (const char* family : {"qwen3", "gemma3"}) {
    const ModelConfig cfg = tiny_config(family);
    auto w = ModelWeights::random(cfg, 8, 0.15f, true);
    const auto toks = toks_for(cfg, 40, 9);
    std::vector<std::vector<float>> r[2];
    for (int i = 0; i < 2; ++i) {
      EngineOptions o = opts2("fp8_e4m3");
      o.num_threads = i + 1;
      auto e = Engine::create(cfg, w, o);
      r[i] = logits_of(*e, toks, 7);
    }
    ASSERT_EQ(r[0].size(), r[1].size());
    for (size_t p = 0; p < r[0].size(); ++p)
      ASSERT_EQ(0, std::memcmp(r[0][p].data(), r[1][p].data(), r[0][p].size() * sizeof(float))) << family << " " << p;
  }
}

// fp32 weights give the same as the reference too (fp32 matrices path).
TEST(Weights, Fp32MatricesMatchReference) {
  const ModelConfig cfg = tiny_config("qwen2");
  auto w = ModelWeights::random(cfg, 77, 0.15f, /*bf16=*/false);
  auto e = Engine::create(cfg, w, opts2("bf16"));
  const auto toks = toks_for(cfg, 20, 4);
  testing::KvRecorder rec(cfg.num_layers);
  e->set_store_observer(&rec);
  const auto got = logits_of(*e, toks, 0);
  testing::RefStats st;
  const auto ref = testing::reference_logits(cfg, *w, toks, KvDtype::bf16, KvScales::unity(cfg.num_layers), true,
                                             &rec.rec, &st);
  EXPECT_EQ(st.mismatched, 0);
  for (size_t p = 0; p < toks.size(); ++p)
    for (int v = 0; v < cfg.vocab_size; ++v) ASSERT_NEAR(got[p][v], ref[p][v], 2e-4 + 2e-4 * std::abs(ref[p][v]));
}

// Each cache format stays within its rounding bound of the unrounded fp32
// reference, and coarser formats are further away: e4m3 (3 mantissa bits,
// relative step 2^-4 after rounding) > bf16 (7 bits, 2^-8).
TEST(Formats, ErrorVsFp32GrowsWithTheFormat) {
  const ModelConfig cfg = tiny_config("llama");
  auto w = ModelWeights::random(cfg, 31, 0.15f, true);
  const auto toks = toks_for(cfg, 40, 12);
  const auto exact = testing::reference_logits(cfg, *w, toks, KvDtype::bf16, KvScales::unity(cfg.num_layers), false);
  std::map<std::string, double> err;
  for (const char* d : {"bf16", "fp8_e4m3", "fp8_e5m2"}) {
    auto e = Engine::create(cfg, w, opts2(d));
    KvScales s = KvScales::unity(cfg.num_layers);
    for (auto& l : s.layers) l.k.values = {0.06f}, l.v.values = {0.03f};
    e->set_kv_scales(s);
    const auto got = logits_of(*e, toks, 0);
    // Mean absolute logprob error per position vs the exact reference.
    double sum = 0.0;
    for (size_t p = 0; p + 1 < toks.size(); ++p) {
      const auto ls = testing::log_softmax(exact[p]);
      std::vector<double> g(got[p].begin(), got[p].end());
      const auto lg = testing::log_softmax(g);
      sum += std::abs(lg[toks[p + 1]] - ls[toks[p + 1]]);
    }
    err[d] = sum / (toks.size() - 1);
  }
  // Relative perturbation of K/V per element is at most 2^-9 (bf16), 2^-4
  // (e4m3), 2^-3 (e5m2); logit perturbations scale with it (|logit| ~ 10 here).
  EXPECT_LT(err["bf16"], 10 * 0x1p-9);
  EXPECT_LT(err["fp8_e4m3"], 10 * 0x1p-4);
  EXPECT_LT(err["fp8_e5m2"], 10 * 0x1p-3);
  EXPECT_LT(err["bf16"], err["fp8_e4m3"]);
  EXPECT_LT(err["fp8_e4m3"], err["fp8_e5m2"]);
  EXPECT_GT(err["fp8_e4m3"], 0.0);
}

}  // namespace
}  // namespace fp8kv
