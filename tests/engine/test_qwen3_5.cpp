// The CPU engine on a tiny random Qwen3.5 model (Gated DeltaNet layers +
// gated full attention): the state pool's life cycle (zeroed at a sequence's
// first token, carried across prefill chunks and decode steps, slots reused),
// chunked prefill against one-shot, decode against prefill, batching,
// preemption by recompute, the state dtypes (--mamba-cache-dtype,
// --mamba-ssm-cache-dtype: the pool's bytes; a bf16 recurrent state against
// the f32 one, exactly where it must be and within a derived bound
// elsewhere). Prefix caching through state snapshots is
// test_qwen3_5_prefix.cpp; the transformers comparison is
// test_goldens_qwen3_5.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../common/errors.h"
#include "engine/engine.h"
#include "engine_fixtures.h"
#include "io/errors.h"
#include "kv/planner.h"
#include "model/config.h"
#include "model/weights.h"
#include "backend/cpu/gdn.h"
#include "numerics/fp8.h"

namespace fp8kv {
using ::testing::HasSubstr;
namespace {

ModelConfig tiny_hybrid() { return testing::tiny_qwen3_5_config(); }

std::vector<int> hybrid_tokens(int n, uint64_t seed) { return testing::random_tokens(tiny_hybrid(), n, seed); }

EngineOptions hybrid_opts(int max_num_seqs = 8) {
  EngineOptions o;
  o.backend = BackendChoice::cpu;
  o.kv_cache_dtype = "bf16";
  o.block_size = 4;
  o.max_model_len = 256;
  o.max_num_batched_tokens = 256;
  o.max_num_seqs = max_num_seqs;
  o.kv_memory_bytes = 8u << 20;
  return o;
}

struct HybridFixture {
  ModelConfig cfg = tiny_hybrid();
  std::shared_ptr<const ModelWeights> w = ModelWeights::random(cfg, 42, 0.15f, /*bf16=*/true);
  std::unique_ptr<Engine> make(const EngineOptions& o = hybrid_opts()) { return Engine::create(cfg, w, o); }
};

double max_logprob_diff(const ScoreResult& a, const ScoreResult& b) {
  double m = 0.0;
  for (size_t i = 1; i < a.logprobs.size(); ++i) m = std::max(m, std::abs(*a.logprobs[i] - *b.logprobs[i]));
  return m;
}

TEST(Qwen3_5Engine, PlanCountsTheStatePoolAndOnlyAttentionLayers) {
  HybridFixture f;
  EngineOptions o = hybrid_opts();
  o.enable_prefix_caching = false;  // no snapshot pool (test_qwen3_5_prefix.cpp counts that one)
  auto e = f.make(o);
  const KvPlan& p = e->kv_plan();
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_EQ(p.groups[0].layers, std::vector<int>{3});
  EXPECT_EQ(p.state.layers, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(p.state.num_slots, 8);
  // Per linear layer: conv [C = 2*8 + 16 = 32][K-1 = 3] bf16 + recurrent [2][8][8] f32.
  EXPECT_EQ(p.state.bytes_per_sequence(), 3u * (32 * 3 * 2 + 2 * 8 * 8 * 4));
  EXPECT_EQ(p.pool_bytes() + p.state.pool_bytes() <= (8u << 20), true);
  EXPECT_EQ(p.num_blocks, static_cast<int64_t>(((8u << 20) - p.state.pool_bytes()) / p.page_bytes));
}

TEST(Qwen3_5Engine, ChunkedPrefillAt64IsBitwiseOneShotAndOtherwiseClose) {
  HybridFixture f;
  auto e = f.make();
  const auto toks = hybrid_tokens(150, 1);
  const ScoreResult one = e->score(toks);
  ScoreOptions c64;
  c64.chunk_size = 64;
  const ScoreResult a = e->score(toks, c64);
  EXPECT_EQ(one.logprobs, a.logprobs);  // GDN chunks are aligned to absolute multiples of 64
  ScoreOptions c10;
  c10.chunk_size = 10;
  const ScoreResult b = e->score(toks, c10);
  // Other boundaries reassociate the delta rule's sums (fp32, gdn.h; the
  // per-layer bound of test_gdn.cpp is ~1e-4 of the state scale), which the
  // logprobs see through 3 linear layers: well under 1e-3.
  const double d = max_logprob_diff(one, b);
  EXPECT_LT(d, 1e-3);
  EXPECT_EQ(one.top1_ids, b.top1_ids);
  for (size_t i = 1; i < one.logprobs.size(); ++i) ASSERT_TRUE(std::isfinite(*one.logprobs[i]));
}

TEST(Qwen3_5Engine, DecodeAgreesWithPrefillAndSlotsAreReused) {
  HybridFixture f;
  auto e = f.make();
  const auto prompt = hybrid_tokens(37, 2);
  GenerateOptions g;
  g.max_tokens = 12;
  g.stop_at_eos = false;
  const GenerateResult r1 = e->generate(prompt, g);
  ASSERT_EQ(r1.tokens.size(), 12u);
  // Another sequence in between, then the first again: a reused slot starts
  // from zero states, so the tokens repeat exactly.
  (void)e->generate(hybrid_tokens(20, 3), g);
  const GenerateResult r2 = e->generate(prompt, g);
  EXPECT_EQ(r1.tokens, r2.tokens);
  // The decode steps (recurrent form) against prefill of the same tokens
  // (chunked form): the same greedy choices.
  std::vector<int> all = prompt;
  all.insert(all.end(), r1.tokens.begin(), r1.tokens.end());
  const ScoreResult s = e->score(all);
  for (size_t i = 0; i < r1.tokens.size(); ++i)
    EXPECT_EQ(*s.top1_ids[prompt.size() + i], r1.tokens[i]) << "generated token " << i;
}

TEST(Qwen3_5Engine, BatchedEqualsAloneAndPreemptionRecomputes) {
  HybridFixture f;
  const std::vector<std::vector<int>> prompts = {hybrid_tokens(30, 4), hybrid_tokens(45, 5), hybrid_tokens(12, 6)};
  GenerateOptions g;
  g.max_tokens = 20;
  g.stop_at_eos = false;
  std::vector<std::vector<int>> alone;
  {
    auto e = f.make();
    for (const auto& p : prompts) alone.push_back(e->generate(p, g).tokens);
  }
  for (bool tight : {false, true}) {
    EngineOptions o = hybrid_opts();
    if (tight) {  // a pool for about one request of 66 tokens: the others are preempted and recomputed
      KvPlanSettings s;
      s.block_size = o.block_size;
      s.max_model_len = 66;
      s.max_num_seqs = o.max_num_seqs;
      s.max_num_batched_tokens = o.max_num_batched_tokens;
      o.max_model_len = 66;
      o.kv_memory_bytes = kv_memory_needed(f.cfg, s) + 4 * 1024;
    }
    auto e = f.make(o);
    std::map<RequestId, std::vector<int>> got;
    std::vector<RequestId> ids;
    for (const auto& p : prompts) ids.push_back(e->submit(Request{p, g}));
    while (!e->idle())
      for (const StepEvent& ev : e->step())
        if (ev.token >= 0) got[ev.id].push_back(ev.token);
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[ids[i]], alone[i]) << "prompt " << i << " tight " << tight;
    if (tight) {
      EXPECT_GT(e->num_preemptions(), 0);
    }
  }
}

TEST(Qwen3_5Engine, PlanCountsTheStateDtypes) {
  HybridFixture f;
  for (const StateDtype conv : {StateDtype::bf16, StateDtype::f32})
    for (const StateDtype ssm : {StateDtype::f32, StateDtype::bf16}) {
      EngineOptions o = hybrid_opts();
      o.enable_prefix_caching = false;
      o.conv_state_dtype = conv;
      o.ssm_state_dtype = ssm;
      auto e = f.make(o);
      const KvPlan& p = e->kv_plan();
      EXPECT_EQ(p.state.conv_dtype, conv);
      EXPECT_EQ(p.state.ssm_dtype, ssm);
      // 3 linear layers x (conv [32][3] + recurrent [2][8][8]) at their element sizes.
      const uint64_t cb = conv == StateDtype::bf16 ? 2 : 4, sb = ssm == StateDtype::bf16 ? 2 : 4;
      EXPECT_EQ(p.state.bytes_per_sequence(), 3u * (32 * 3 * cb + 2 * 8 * 8 * sb));
      EXPECT_EQ(p.num_blocks, static_cast<int64_t>(((8u << 20) - p.state.pool_bytes()) / p.page_bytes));
      EXPECT_NE(kv_plan_log_line(p).find(fmt::format("conv {}, recurrent {}", state_dtype_name(conv),
                                                     state_dtype_name(ssm))),
                std::string::npos)
          << kv_plan_log_line(p);
    }
}

// The exact cases of a bf16 recurrent state (rounded once per step, when
// the step stores it; gdn_rule_step): a sequence scored in one step reads
// zero states and rounds only after its outputs, so its logprobs are bitwise
// those of the f32 state, through every layer of the model; scored in
// chunks, the first chunk's are (the chunks after it read a rounded state).
// A float32 conv state too.
TEST(Qwen3_5Engine, Bf16StateIsExactWithinTheFirstStep) {
  HybridFixture f;
  const auto toks = hybrid_tokens(150, 41);
  EngineOptions o = hybrid_opts();
  auto f32 = f.make(o);
  o.ssm_state_dtype = StateDtype::bf16;
  auto bf16 = f.make(o);
  o.conv_state_dtype = StateDtype::f32;
  auto both = f.make(o);
  EXPECT_EQ(bf16->score(toks).logprobs, f32->score(toks).logprobs);
  ScoreOptions c;
  c.chunk_size = 40;
  const ScoreResult a = f32->score(toks, c), b = bf16->score(toks, c);
  for (int i = 1; i <= 40; ++i) ASSERT_EQ(*a.logprobs[i], *b.logprobs[i]) << "position " << i;
  bool differs = false;
  for (size_t i = 41; i < a.logprobs.size(); ++i) differs = differs || *a.logprobs[i] != *b.logprobs[i];
  EXPECT_TRUE(differs) << "the bf16 state's rounding reached no later chunk";
  // A float32 conv state keeps the conv inputs unrounded: other logprobs, finite.
  const ScoreResult w = both->score(toks);
  EXPECT_NE(w.logprobs, bf16->score(toks).logprobs);
  for (size_t i = 1; i < w.logprobs.size(); ++i) ASSERT_TRUE(std::isfinite(*w.logprobs[i]));
}

// A bf16 recurrent state against the f32 one over many steps: logprobs
// within a bound derived from the roundings, never fitted to what is seen.
// To derive it from the weights, the model is the tiny hybrid with
// (i) rms_norm_eps = 1, which makes every RMSNorm globally Lipschitz: the
// map x -> x / s(x), s = sqrt(mean(x^2) + eps), has the Jacobian (I - x x^T /
// (n s^2)) / s, of norm 1 / s <= 1 / sqrt(eps); (ii) the outputs of layers
// 1-3 and of every MLP zeroed (out_proj, o_proj, down_proj = 0), so the
// final residual is h = e + W_out y, e the token's embedding and y layer 0's
// Gated DeltaNet output (the other layers still run, on their own bf16
// states); (iii) layer 0's decays near 1/2 (A = 1/2), so a state forgets in
// a few tokens and roundings do not pile up; (iv) its gated norm's weight x 8
// (exact), so that its share of the logits, and what the test measures,
// stands well above a logprob's f32 noise. Layer 0's inputs are then
// functions of the token alone (x = norm(e)): the same on both sides, and
// computable here. Per value head (Dk = Dv = 8; norms are Frobenius / 2-norms;
// u = 2^-24):
//  - B >= |S|, the f32 side's state: the test runs layer 0 itself
//    (backend/cpu/gdn.h, the recurrent form) on inputs it computes in double.
//    The engine's inputs differ by its f32 GEMMs (1e-5 relative) and by a
//    conv input rounded to the other bf16 neighbour (2^-7 of it at most), so
//    its v by at most dv = 1.1 (2^-7 + 1e-4) W, W = |sum_j |w_j| |x_{t-3+j}||
//    per channel (silu is 1.1-Lipschitz), and its state by D(t) = d D(t-1) +
//    beta dv + 1e-5 (|S_sim| + |v|) + F (below): B = |S_sim| + D.
//  - The state map of a token is S -> d (I - beta k k^T) S + beta k v^T
//    (|k| <= 1, d = exp(g), beta in (0, 1]): in exact arithmetic a difference
//    of two states shrinks by d. Rounding to bf16 (8 significant bits,
//    nearest even) moves an element by at most 2^-8 of its magnitude. So E,
//    a bound on |S' - S|: E(t) = d E(t-1) + F per token, F = both sides' f32
//    rounding of a token's update, per element (64 + 4 Dk + 8) u (B + |v|)
//    (tests/backend_cpu/test_gdn.cpp's terms), sqrt(Dk Dv) times that in
//    norm; and E += 2^-8 (B + E) where a step ends (its rounding).
//  - o = S^T q, |q| <= 1/sqrt(Dk): |o' - o| <= (E + 2 Dk u (B + E)) / sqrt(Dk)
//    (the second term: either side's rounding of the Dk-term sums). The
//    gated norm y = w_n silu(z) o / s(o): |y' - y| <= Z |o' - o|, Z = max
//    |w_n silu(z)| of the head at the token.
//  - |h' - h| <= |W_out|_2 |y' - y| (|W|_2^2 <= the largest absolute row sum
//    of W^T W, Gershgorin); the final norm: |n' - n| <= max |w_f| |h' - h|;
//    logits: |l' - l|_inf <= max_v |W_lm,v| |n' - n|; a log-softmax moves by
//    at most 2 |l' - l|_inf.
//  - Plus both sides' f32 rounding from y to the logprob (gated norm,
//    out_proj and the residual add, final norm, lm_head, log-softmax: 5
//    stages of sums of at most 64 terms, magnitudes at most 1 + the logits'
//    bound): 2 x 2 x 5 x 64 u (1 + |l|max).
// Every per-token input computed in double is inflated by 1e-4 for the
// engine's f32. The bound is useful only below what a wrong state does: the
// f32 side's logprobs of each chunk scored alone from zero states (the
// state carries nothing else in this model) must be farther from the f32
// side than the bound.
TEST(Qwen3_5Engine, Bf16StateWithinTheDerivedLogprobBound) {
  ModelConfig cfg = tiny_hybrid();
  cfg.rms_norm_eps = 1.0;
  auto m = std::make_shared<ModelWeights>(*ModelWeights::random(cfg, 42, 0.15f, /*bf16=*/true));
  auto zero = [](WeightMatrix& w) {
    auto buf = std::make_shared<std::vector<uint8_t>>(w.bytes(), 0);
    w.data = buf->data();
    w.owner = buf;
  };
  for (int l = 0; l < cfg.num_layers; ++l) {
    zero(m->layers[l].down_proj);
    if (l > 0) zero(cfg.is_linear(l) ? m->layers[l].out_proj : m->layers[l].o_proj);
  }
  LayerWeights& L0 = m->layers[0];
  for (float& a : L0.A_log) a = std::log(0.5f);
  for (float& w : L0.gdn_norm) w *= 8.0f;
  const GatedDeltaNetConfig& g = *cfg.gdn;
  const int H = cfg.hidden_size, C = static_cast<int>(g.conv_dim()), K = g.conv_kernel, Hv = g.num_v_heads,
            Dk = g.k_head_dim, Dv = g.v_head_dim, KD = static_cast<int>(g.key_dim());
  ASSERT_EQ(g.num_k_heads, 1);
  auto at = [](const WeightMatrix& w, int r, int c) -> double {
    const size_t i = static_cast<size_t>(r) * w.cols + c;
    return w.bf16 ? bf16_to_f32(static_cast<const uint16_t*>(w.data)[i]) : static_cast<const float*>(w.data)[i];
  };
  auto matvec = [&](const WeightMatrix& w, const std::vector<double>& x) {
    std::vector<double> y(w.rows, 0.0);
    for (int r = 0; r < w.rows; ++r)
      for (int c = 0; c < w.cols; ++c) y[r] += at(w, r, c) * x[c];
    return y;
  };
  // The weights' constants: |W_out|_2 (Gershgorin on W^T W), max_v |W_lm,v|, max |w_f|.
  double W2 = 0.0, L_lm = 0.0, G_f = 0.0;
  for (int j = 0; j < L0.out_proj.cols; ++j) {
    double row = 0.0;
    for (int k = 0; k < L0.out_proj.cols; ++k) {
      double wtw = 0.0;
      for (int r = 0; r < L0.out_proj.rows; ++r) wtw += at(L0.out_proj, r, j) * at(L0.out_proj, r, k);
      row += std::fabs(wtw);
    }
    W2 = std::max(W2, row);
  }
  W2 = std::sqrt(W2) * (1 + 1e-9);
  for (int v = 0; v < cfg.vocab_size; ++v) {
    double ss = 0.0;
    for (int c = 0; c < H; ++c) ss += at(m->output(), v, c) * at(m->output(), v, c);
    L_lm = std::max(L_lm, std::sqrt(ss));
  }
  for (float x : m->final_norm) G_f = std::max(G_f, std::fabs(static_cast<double>(x)));

  const double u = std::ldexp(1.0, -24), r8 = std::ldexp(1.0, -8), in = 1 + 1e-4;
  const std::vector<int> toks = hybrid_tokens(96, 43);
  const int n = static_cast<int>(toks.size());
  // Per token: layer 0's input x = norm(e) and its projections; the gates
  // d (decay) and beta, Z, and W per value head; |e|.
  std::vector<std::vector<double>> qkv(n);
  std::vector<std::vector<double>> d(n, std::vector<double>(Hv)), beta(d), Z(d), W(d);
  std::vector<double> e_norm(n);
  std::vector<float> xf(static_cast<size_t>(n) * C), af(static_cast<size_t>(n) * Hv), bf(af.size());
  for (int t = 0; t < n; ++t) {
    std::vector<double> e(H), x(H);
    double ms = 0.0;
    for (int c = 0; c < H; ++c) ms += (e[c] = at(m->embed, toks[t], c)) * e[c];
    e_norm[t] = std::sqrt(ms);
    for (int c = 0; c < H; ++c) x[c] = L0.input_norm[c] * e[c] / std::sqrt(ms / H + cfg.rms_norm_eps);
    qkv[t] = matvec(L0.in_proj_qkv, x);
    const std::vector<double> z = matvec(L0.in_proj_z, x), a = matvec(L0.in_proj_a, x), b = matvec(L0.in_proj_b, x);
    for (int c = 0; c < C; ++c) xf[t * C + c] = static_cast<float>(qkv[t][c]);
    for (int h = 0; h < Hv; ++h) {
      af[t * Hv + h] = static_cast<float>(a[h]);
      bf[t * Hv + h] = static_cast<float>(b[h]);
      const double xa = a[h] + L0.dt_bias[h], sp = xa > 20 ? xa : std::log1p(std::exp(xa));
      d[t][h] = std::min(1.0, std::exp(-std::exp(static_cast<double>(L0.A_log[h])) * sp) * in);
      beta[t][h] = std::min(1.0, in / (1 + std::exp(-b[h])));
      double zmax = 0.0;
      for (int i = 0; i < Dv; ++i) {
        const double zi = z[h * Dv + i], silu = zi / (1 + std::exp(-zi));
        zmax = std::max(zmax, std::fabs(L0.gdn_norm[i]) * (std::fabs(silu) + 1e-4 * std::fabs(zi)));
      }
      Z[t][h] = zmax + 1e-12;
      double ww = 0.0;
      for (int ch = 2 * KD + h * Dv; ch < 2 * KD + (h + 1) * Dv; ++ch) {
        double c = 0.0;
        for (int j = 0; j < K; ++j) {
          const int s = t - (K - 1) + j;
          if (s >= 0) c += std::fabs(L0.conv1d[ch * K + j]) * std::fabs(qkv[s][ch]) * (1 + r8);
        }
        ww += c * c;
      }
      W[t][h] = std::sqrt(ww) * in;
    }
  }
  // Layer 0 on the f32 side, run here: |S_sim| and |v_sim| per token and head.
  const GdnShape gs{1, Hv, Dk, Dv, K};
  std::vector<uint16_t> conv_state(gs.conv_state_elems(), 0);
  std::vector<float> conv_out(xf.size()), gf(af.size()), betaf(af.size());
  gdn_causal_conv(xf.data(), n, C, K, L0.conv1d.data(), conv_state.data(), GdnStateType::bf16, conv_out.data());
  gdn_gates(af.data(), bf.data(), n, Hv, L0.A_log.data(), L0.dt_bias.data(), gf.data(), betaf.data());
  std::vector<std::vector<double>> S_sim(n, std::vector<double>(Hv)), v_sim(S_sim);
  {
    std::vector<float> S(gs.ssm_state_elems(), 0.0f), o(gs.value_dim());
    for (int t = 0; t < n; ++t) {
      gdn_rule_recurrent(gs, conv_out.data() + t * C, 1, gf.data() + t * Hv, betaf.data() + t * Hv, S.data(),
                         o.data());
      for (int h = 0; h < Hv; ++h) {
        double ss = 0.0, vv = 0.0;
        for (int i = 0; i < Dk * Dv; ++i) ss += std::pow(static_cast<double>(S[h * Dk * Dv + i]), 2);
        for (int i = 0; i < Dv; ++i) vv += std::pow(static_cast<double>(conv_out[t * C + 2 * KD + h * Dv + i]), 2);
        S_sim[t][h] = std::sqrt(ss);
        v_sim[t][h] = std::sqrt(vv);
      }
    }
  }
  // The bound on logprobs[t + 1] (logits row t) when a step ends after every
  // `chunk` rows.
  auto bound = [&](int chunk) {
    std::vector<double> out(n + 1, 0.0), D(Hv, 0.0), E(Hv, 0.0);
    for (int t = 0; t < n; ++t) {
      double dy2 = 0.0, y2 = 0.0;
      for (int h = 0; h < Hv; ++h) {
        const double dv = 1.1 * (2 * r8 + 1e-4) * W[t][h], v = v_sim[t][h] + dv;
        const double F = 2 * (64 + 4.0 * Dk + 8) * u * (S_sim[t][h] + D[h] + v) * std::sqrt(double(Dk) * Dv);
        D[h] = d[t][h] * D[h] + beta[t][h] * dv + 1e-5 * (S_sim[t][h] + v) + F;
        const double B = S_sim[t][h] + D[h];
        E[h] = d[t][h] * E[h] + F;
        dy2 += std::pow(Z[t][h] * (E[h] + 2 * Dk * u * (B + E[h])) / std::sqrt(double(Dk)), 2);
        y2 += std::pow(Z[t][h] * (B + E[h]) / std::sqrt(double(Dk)), 2);
        if ((t + 1) % chunk == 0) E[h] += r8 * (B + E[h]);  // the step ends: the bf16 side rounds its state
      }
      const double l_max = L_lm * G_f * (e_norm[t] + W2 * std::sqrt(y2));
      out[t + 1] = 2 * L_lm * G_f * W2 * std::sqrt(dy2) + 2 * 2 * 5 * 64 * u * (1 + l_max);
    }
    return out;
  };
  EngineOptions o = hybrid_opts();
  auto f32 = Engine::create(cfg, m, o);
  o.ssm_state_dtype = StateDtype::bf16;
  auto bf16 = Engine::create(cfg, m, o);
  for (const int chunk : {1, 2, 10}) {  // a step per token (the recurrent form), and chunked prefills
    ScoreOptions so;
    so.chunk_size = chunk;
    const ScoreResult a = f32->score(toks, so), b = bf16->score(toks, so);
    const std::vector<double> tol = bound(chunk);
    double worst = 0.0, worst_ratio = 0.0, max_tol = 0.0;
    for (int i = 1; i < n; ++i) {
      const double diff = std::fabs(*a.logprobs[i] - *b.logprobs[i]);
      EXPECT_LE(diff, tol[i]) << "chunk " << chunk << ", position " << i;
      worst = std::max(worst, diff);
      worst_ratio = std::max(worst_ratio, diff / tol[i]);
      max_tol = std::max(max_tol, tol[i]);
    }
    // A wrong state: each chunk scored alone, from zero states (logprobs of
    // its rows after the first).
    double lost = 0.0;
    for (int s0 = 0; chunk > 1 && s0 + 1 < n; s0 += chunk) {
      const std::vector<int> part(toks.begin() + s0, toks.begin() + std::min(n, s0 + chunk));
      const ScoreResult alone = f32->score(part);
      for (size_t i = 1; i < part.size(); ++i)
        lost = std::max(lost, std::fabs(*alone.logprobs[i] - *a.logprobs[s0 + i]));
    }
    std::printf("chunks of %d: max |logprob bf16 - f32| %.3g, at most %.3g of its bound; largest bound %.3g; a lost "
                "state moves them by up to %s\n",
                chunk, worst, worst_ratio, max_tol, chunk > 1 ? fmt::format("{:.3g}", lost).c_str() : "(n/a)");
    EXPECT_GT(worst, 0.0) << "chunk " << chunk << ": the roundings had no effect";
    if (chunk > 1) {
      EXPECT_LT(max_tol, lost) << "chunk " << chunk << ": the bound would not see a lost state";
    }
  }
}

// Tensor parallelism shards the linear heads like attention heads
// (test_tp_qwen3_5_fp8.cpp runs it): this model's single key head cannot
// be split over 2 ranks, and the refusal names both linear head fields.
TEST(Qwen3_5Engine, TensorParallelNeedsTheLinearHeadsToDivide) {
  HybridFixture f;
  EngineOptions o = hybrid_opts();
  o.tensor_parallel_size = 2;
  EXPECT_THAT(test_util::input_error_of([&] { f.make(o); }),
              HasSubstr("--tensor-parallel-size 2 does not divide linear_num_key_heads 1 and "
                        "linear_num_value_heads 2"));
}

}  // namespace
}  // namespace fp8kv
