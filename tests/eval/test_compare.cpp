// eval compare / kvstats / niah on a tiny llama with a planted V outlier in
// layer 1 (the calibration tests' checkpoint, tests/calib/tiny_checkpoint.h):
// kvstats finds clipping in that layer only; compare shows fp8:unity with a
// larger KLD than calibrated fp8; bf16 vs bf16 gives KLD 0 exactly. Plus the
// per-position metrics against hand computations.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "../common/errors.h"
#include "../calib/tiny_checkpoint.h"
#include "calib/calibrate.h"
#include "calib/inject.h"
#include "eval/compare.h"
#include "eval/kvstats.h"
#include "eval/niah.h"
#include "eval/report_html.h"
#include "io/errors.h"
#include "../common/temp_dir.h"

namespace fs = std::filesystem;
using namespace fp8kv;
using ::testing::HasSubstr;
using namespace fp8kv::eval;

namespace {

using fp8kv::test_util::TempDir;
using fp8kv::testing::random_token_seqs;

EngineOptions small_engine() {
  EngineOptions o;
  o.max_model_len = 256;
  o.kv_memory_bytes = 8u << 20;
  o.num_threads = 1;
  o.max_num_seqs = 1;
  return o;
}

// A bf16-cache engine (small_engine's limits) on the checkpoint in dir.
std::unique_ptr<Engine> bf16_engine(const fs::path& dir) {
  EngineOptions o = small_engine();
  o.kv_cache_dtype = "bf16";
  return Engine::load(dir, o);
}

// Scores each doc with obs attached (detached after).
void observe(Engine& e, StoreObserver& obs, const std::vector<std::vector<int>>& docs) {
  e.set_store_observer(&obs);
  for (const auto& doc : docs) e.score(doc);
  e.set_store_observer(nullptr);
}

const nlohmann::json& arm_named(const nlohmann::json& r, const std::string& name) {
  for (const auto& a : r["arms"])
    if (a["name"] == name) return a;
  throw std::runtime_error("no arm " + name);
}

}  // namespace

TEST(ComparePosition, MatchesHandComputation) {
  // P = (0.5, 0.25, 0.25), Q = (0.25, 0.5, 0.25): KL = 0.5 ln 2 - 0.25 ln 2 = 0.25 ln 2.
  std::vector<float> lp(3), lq(3);
  log_softmax(std::vector<float>{std::log(2.0f), 0.0f, 0.0f}, lp);
  log_softmax(std::vector<float>{0.0f, std::log(2.0f), 0.0f}, lq);
  EXPECT_NEAR(std::exp(lp[0]), 0.5, 1e-7);
  const auto d = compare_position(lp, 0, lq, 1, 2);
  EXPECT_NEAR(d.kld, 0.25 * std::log(2.0), 1e-7);
  EXPECT_NEAR(d.nll_ref, std::log(4.0), 1e-6);
  EXPECT_NEAR(d.nll_arm, std::log(4.0), 1e-6);
  EXPECT_FALSE(d.top1_same);
  const auto same = compare_position(lp, 0, lp, 0, 1);
  EXPECT_EQ(same.kld, 0.0);
  EXPECT_TRUE(same.top1_same);
  EXPECT_EQ(argmax_lowest(std::vector<float>{1.0f, 3.0f, 3.0f}), 1);
}

TEST(CompareSummary, BucketsPplAndPercentiles) {
  ArmSamples s;
  s.name = "x";
  // Four positions: dNLL 0.1 at pos 1, 0.3 at pos 2 (bucket [0,2)); 0 at pos 2, 3 ([2, inf)).
  const double dn[4] = {0.1, 0.3, 0.0, 0.0};
  const int pos[4] = {1, 1, 2, 3};
  for (int i = 0; i < 4; ++i) {
    PositionDelta d;
    d.kld = 0.01 * (i + 1);
    d.nll_ref = 1.0;
    d.nll_arm = 1.0 + dn[i];
    d.p_ref = std::exp(-1.0);
    d.p_arm = std::exp(-d.nll_arm);
    d.top1_same = i != 1;
    s.add(d, pos[i], i < 2 ? 0 : 1);
  }
  CompareStatsOptions o;
  o.buckets = {0, 2};
  o.bootstrap_resamples = 200;
  const auto j = summarize_arm(s, {"a", "b"}, o);
  EXPECT_NEAR(j["ppl"].get<double>(), std::exp(1.1), 1e-12);
  EXPECT_NEAR(j["ppl_delta_pct"].get<double>(), 100 * std::expm1(0.1), 1e-10);
  EXPECT_DOUBLE_EQ(j["top1_agree"].get<double>(), 0.75);
  EXPECT_NEAR(j["kld"]["mean"].get<double>(), 0.025, 1e-15);
  EXPECT_NEAR(j["kld"]["median"].get<double>(), 0.025, 1e-15);
  EXPECT_NEAR(j["kld"]["max"].get<double>(), 0.04, 1e-15);
  ASSERT_EQ(j["buckets"].size(), 2u);
  EXPECT_EQ(j["buckets"][0]["n"], 2);
  EXPECT_NEAR(j["buckets"][0]["dnll_pct"].get<double>(), 100 * std::expm1(0.2), 1e-10);
  EXPECT_DOUBLE_EQ(j["buckets"][0]["top1_agree"].get<double>(), 0.5);
  EXPECT_TRUE(j["buckets"][1]["hi"].is_null());
  EXPECT_NEAR(j["buckets"][1]["dnll_pct"].get<double>(), 0.0, 1e-15);
  ASSERT_EQ(j["documents"].size(), 2u);
  EXPECT_NEAR(j["documents"][0]["ppl_delta_pct"].get<double>(), 100 * std::expm1(0.2), 1e-10);
  EXPECT_EQ(j["doc_sign_flip"]["n_worse"], 1);
  EXPECT_DOUBLE_EQ(j["doc_sign_flip"]["p_value"].get<double>(), 1.0);  // 2 docs: {0.2, 0}: p = 1
  // RMS of the change in p of the actual token.
  double s2 = 0;
  for (double x : dn) s2 += std::pow(std::exp(-1.0 - x) - std::exp(-1.0), 2);
  EXPECT_NEAR(j["rms_dp"].get<double>(), std::sqrt(s2 / 4), 1e-12);
  EXPECT_FALSE(j.dump().find("NaN") != std::string::npos);
  // The HTML page renders and is self-contained.
  nlohmann::json r{{"model", "m<x>"}, {"reference", "x"}, {"context", 4}, {"documents", {"a", "b"}}, {"arms", {j, j}}};
  const std::string html = compare_report_html(r);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("m&lt;x&gt;"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
}

TEST(CompareArgs, ParsesArmsAndBuckets) {
  auto arms = parse_arms("bf16,fp8,fp8:unity,fp8:scales=/x/y,fp8_e5m2");
  ASSERT_EQ(arms.size(), 5u);
  EXPECT_EQ(arms[1].dtype, KvDtype::fp8_e4m3);
  EXPECT_EQ(arms[1].scales, ArmSpec::Scales::checkpoint);
  EXPECT_EQ(arms[2].scales, ArmSpec::Scales::unity);
  EXPECT_EQ(arms[3].scales, ArmSpec::Scales::dir);
  EXPECT_EQ(arms[3].scales_dir, "/x/y");
  EXPECT_EQ(arms[4].dtype, KvDtype::fp8_e5m2);
  EXPECT_THROW(parse_arms("bf16,bf16"), InputError);
  EXPECT_THROW(parse_arms("bf16,control"), InputError);
  EXPECT_THROW(parse_arms("fp16"), InputError);
  EXPECT_THROW(parse_arms("fp8:bogus"), InputError);
  EXPECT_THROW(parse_arms("bf16:unity"), InputError);
  EXPECT_THROW(parse_arms(""), InputError);
  EXPECT_EQ(parse_buckets("0,512,1024"), (std::vector<int>{0, 512, 1024}));
  EXPECT_THROW(parse_buckets("1,2"), InputError);
  EXPECT_THROW(parse_buckets("0,5,5"), InputError);
  EXPECT_THROW(parse_buckets("0,x"), InputError);
  // The same integer-list parser (and words) as --lengths/--depths/--ids:
  // spaces around items allowed, a bad item named with the accepted range.
  EXPECT_EQ(parse_buckets("0, 8 ,16"), (std::vector<int>{0, 8, 16}));
  EXPECT_THAT(test_util::input_error_of([&] { parse_buckets("0,-4"); }),
              HasSubstr("--buckets '0,-4': '-4' is not an integer in [0, 2147483647]"));
  EXPECT_THROW(parse_buckets("0,,8"), InputError);
  EXPECT_EQ(cut_chunks({1, 2, 3, 4, 5}, 2).size(), 2u);  // last chunk of 1 token dropped
  EXPECT_EQ(cut_chunks({1, 2, 3, 4, 5, 6}, 2).size(), 3u);
}

TEST(EvalOutlier, KvStatsFindsClippingInTheOutlierLayerOnly) {
  TempDir d;
  const fs::path m = d.path() / "m";
  fp8kv::testing::write_tiny_checkpoint(m, {.outlier_layer = 1, .outlier_gain = 400.0f});
  auto e = bf16_engine(m);
  KvStatsObserver obs(kvstats_scales("unity", 3, nullptr), KvDtype::fp8_e4m3);
  observe(*e, obs, random_token_seqs(2, 64, 3));
  const auto j = obs.to_json(e->config());
  ASSERT_EQ(j["layers"].size(), 9u);
  for (const auto& l : j["layers"]) {
    const bool outlier = l["layer"] == 1 && l["stream"] == "v";
    if (outlier) {
      EXPECT_GT(l["clip_frac"].get<double>(), 0.0) << l.dump();
      EXPECT_GT(l["amax"].get<double>(), 448.0);
      EXPECT_LE(l["p9999"].get<double>(), l["amax"].get<double>());
    } else {
      EXPECT_EQ(l["clipped"], 0) << l.dump();
    }
    EXPECT_GT(l["rt_err"].get<double>(), 0.0);
    EXPECT_LT(l["rt_err"].get<double>(), 0.2);
    // 2 docs x 64 tokens, head_dim 16, 4 query heads, 2 KV heads.
    EXPECT_EQ(l["count"].get<uint64_t>(), 128u * (l["stream"] == "q" ? 4u : 2u) * 16u);
  }
  ASSERT_EQ(j["pooled"].size(), 3u);  // llama: all full_attention
  EXPECT_EQ(j["pooled"][2]["type"], "full_attention");
  EXPECT_EQ(j["pooled"][2]["stream"], "v");
  EXPECT_GT(j["pooled"][2]["clip_frac"].get<double>(), 0.0);
  // A scale sized from the measured amax removes the clipping.
  KvStatsObserver big(kvstats_scales(std::to_string(j["layers"][5]["amax"].get<double>() / 400.0), 3, nullptr),
                      KvDtype::fp8_e4m3);
  observe(*e, big, random_token_seqs(2, 64, 3));
  EXPECT_EQ(big.to_json(e->config())["layers"][5]["clipped"], 0);
  EXPECT_THROW(kvstats_scales("-1", 3, nullptr), InputError);
  EXPECT_THROW(kvstats_scales("abc", 3, nullptr), InputError);
}

// A Qwen3.5 hybrid (the tiny golden: layers 0-2 linear_attention, layer 3
// full_attention): the per-layer rows and the pools hold the KV-cache layer
// only (docs/design.md "KV scales of hybrid models").
TEST(EvalKvStats, HybridListsTheKvCacheLayersOnly) {
  if (!fs::exists(fp8kv::testing::qwen3_5_golden_dir() / "model.safetensors")) GTEST_SKIP() << "no golden";
  TempDir d;
  const fs::path m = d.path() / "m";
  fp8kv::testing::write_qwen3_5_checkpoint(m, false);
  auto e = bf16_engine(m);
  KvStatsObserver obs(kvstats_scales("unity", 4, nullptr), KvDtype::fp8_e4m3);
  observe(*e, obs, random_token_seqs(2, 40, 5));
  const auto j = obs.to_json(e->config());
  ASSERT_EQ(j["layers"].size(), 3u);  // layer 3: q, k, v
  for (const auto& l : j["layers"]) {
    EXPECT_EQ(l["layer"], 3) << l.dump();
    EXPECT_EQ(l["type"], "full_attention");
    EXPECT_GT(l["count"].get<uint64_t>(), 0u);
  }
  ASSERT_EQ(j["pooled"].size(), 3u);
  for (const auto& p : j["pooled"]) EXPECT_EQ(p["num_layers"], 1) << p.dump();
  const std::string t = obs.table(e->config());
  EXPECT_EQ(t.find("linear"), std::string::npos) << t;
}

TEST(EvalOutlier, CompareUnityWorseThanCalibratedAndBf16SelfIsZero) {
  TempDir d;
  const fs::path m = d.path() / "m", cal = d.path() / "cal";
  fp8kv::testing::write_tiny_checkpoint(m, {.outlier_layer = 1, .outlier_gain = 400.0f});
  {
    EngineOptions o = small_engine();
    o.kv_cache_dtype = "bf16";
    auto bf16 = Engine::load(m, o);
    // modelopt (floored at 1): only the outlier layer's V scale moves, so the
    // arms differ by clipping alone. The floorless default also rescales the
    // unclipped layers, which on this random model reshuffles rounding at a
    // few tail positions: mean KLD 0.0017 vs unity's 0.00063 over 282
    // positions, K alone rescaled 0.00017, V alone 0.00088 (noise the size
    // of the effect; e4m3's relative step is scale-free in its normal range).
    CalibrateOptions co;
    co.rule = ScaleRule::parse("modelopt");
    const CalibrationReport rep = calibrate(*bf16, random_token_seqs(4, 48, 11), co);
    ASSERT_TRUE(rep.complete) << rep.reason;
    InjectOptions io;
    io.model_dir = m;
    io.output_dir = cal;
    inject_kv_scales(io, rep.to_json());
  }
  CompareInput in;
  in.model_dir = m;
  in.engine = small_engine();
  in.arms = parse_arms("bf16,fp8:unity,fp8:scales=" + cal.string());
  in.arms.push_back(parse_arm("bf16"));  // bf16 again (same spec, different name via copy)
  in.arms.back().name = "bf16-again";
  in.docs = random_token_seqs(3, 96, 99);
  in.doc_names = {"d0", "d1", "d2"};
  in.context = 64;
  in.stats.buckets = {0, 16, 32};
  in.stats.bootstrap_resamples = 200;
  uint64_t last = 0;
  const auto r = run_compare(in, [&](uint64_t done, uint64_t total) {
    EXPECT_GT(done, last);
    EXPECT_LE(done, total);
    last = done;
  });
  EXPECT_EQ(r["reference"], "bf16");
  ASSERT_EQ(r["arms"].size(), 4u);
  EXPECT_EQ(r["arms"][0]["name"], "bf16");
  for (const char* self : {"bf16", "bf16-again"}) {
    const auto& a = arm_named(r, self);
    EXPECT_EQ(a["kld"]["mean"].get<double>(), 0.0) << self;
    EXPECT_EQ(a["kld"]["max"].get<double>(), 0.0) << self;
    EXPECT_EQ(a["top1_agree"].get<double>(), 1.0) << self;
    EXPECT_EQ(a["ppl_delta_pct"].get<double>(), 0.0) << self;
  }
  const auto& unity = arm_named(r, "fp8:unity");
  const auto& calibrated = arm_named(r, "fp8:scales=" + cal.string());
  std::printf("KLD mean: unity %.4g, calibrated %.4g; top-1: %.4f vs %.4f\n", unity["kld"]["mean"].get<double>(),
              calibrated["kld"]["mean"].get<double>(), unity["top1_agree"].get<double>(),
              calibrated["top1_agree"].get<double>());
  // Measured (fixed seeds): unity 6.3e-4 vs calibrated (modelopt) 2.3e-4.
  EXPECT_GT(unity["kld"]["mean"].get<double>(), 1.3 * calibrated["kld"]["mean"].get<double>());
  EXPECT_GT(calibrated["kld"]["mean"].get<double>(), 0.0);
  // Positions: chunks of 64 -> 63 scored + 32 -> 31 scored per doc.
  EXPECT_EQ(unity["n_positions"], 3u * (63u + 31u));
  EXPECT_EQ(unity["buckets"].size(), 3u);
  EXPECT_EQ(unity["buckets"][0]["n"], 3u * 2u * 15u);  // positions 1..15 of both chunks
  EXPECT_TRUE(unity["buckets"][2]["hi"].is_null());
  const double tf = unity["top1_agree"].get<double>();
  EXPECT_GE(tf, 0.0);
  EXPECT_LE(tf, 1.0);
  EXPECT_TRUE(unity["doc_sign_flip"]["exact"].get<bool>());
}

TEST(EvalControl, ControlPassAlignsPositions) {
  TempDir d;
  const fs::path m = d.path() / "m";
  fp8kv::testing::write_tiny_checkpoint(m, {});
  CompareInput in;
  in.model_dir = m;
  in.engine = small_engine();
  in.arms = parse_arms("bf16");
  in.docs = random_token_seqs(2, 60, 5);
  in.doc_names = {"a", "b"};
  in.context = 40;
  in.control = true;
  in.control_prefix = {7, 8, 9};
  in.stats.bootstrap_resamples = 100;
  const auto r = run_compare(in);
  ASSERT_EQ(r["arms"].size(), 2u);
  EXPECT_EQ(r["arms"][1]["name"], "control");
  EXPECT_EQ(r["context"], 37);  // context - prefix
  // Chunks of 37 and 23 tokens: 36 + 22 scored per doc, in both passes.
  EXPECT_EQ(r["arms"][1]["n_positions"], 2u * (36u + 22u));
  EXPECT_EQ(r["arms"][0]["n_positions"], r["arms"][1]["n_positions"]);
  // The prefix changes conditioning: the control differs, but is no different model.
  EXPECT_GT(r["arms"][1]["kld"]["mean"].get<double>(), 0.0);
  // An empty-prefix control is the reference itself: KLD exactly 0 is impossible
  // to ask for (empty prefix is rejected), so check the rejection instead.
  in.control_prefix.clear();
  EXPECT_THROW(run_compare(in), InputError);
}

TEST(Niah, PromptFormatAndScoring) {
  const std::string hay = "Alpha one. Beta two. Gamma three. Delta four.";
  // depth 0.3 -> byte 13, next sentence end is after "two." (index 19).
  EXPECT_EQ(insert_needle(hay, 0.3, "12345"),
            "Alpha one. Beta two. The passkey is 12345. Remember it. 12345 is the passkey. Gamma three. Delta four.");
  EXPECT_EQ(insert_needle(hay, 1.0, "00000"), hay + " The passkey is 00000. Remember it. 00000 is the passkey.");
  EXPECT_EQ(insert_needle(hay, 0.0, "11111"),
            "Alpha one. The passkey is 11111. Remember it. 11111 is the passkey. Beta two. Gamma three. Delta four.");
  const std::string p = needle_prompt(hay, 1.0, "42424");
  EXPECT_EQ(p.substr(p.size() - 37), "\n\nWhat is the passkey? The passkey is");
  EXPECT_TRUE(niah_correct(" 12345.", "12345"));
  EXPECT_TRUE(niah_correct("12345", "12345"));
  EXPECT_FALSE(niah_correct(" 1234", "12345"));
  EXPECT_FALSE(niah_correct(" 12346", "12345"));
  EXPECT_FALSE(niah_correct(" a12345", "12345"));
}

TEST(Niah, LengthBeyondMaxModelLenIsNamedBeforeTheHaystack) {
  // Issue 15 item 17: --lengths 100000 on a short haystack used to say the
  // haystack was too short; the cause is max_model_len.
  const auto tok = Tokenizer::load(std::filesystem::path(FP8KV_SOURCE_DIR) / "tests/data/tokenizers/bytelevel.json");
  NiahOptions o;
  o.lengths = {64, 100000};
  o.depths = {50};
  o.trials = 1;
  o.max_model_len = 4096;
  try {
    build_niah_prompts(*tok, "Short hay. Very short.", o);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "--lengths: 100000 exceeds max_model_len 4096 (--max-model-len)");
  }
  // Within the limit, the error is about the haystack, not max_model_len.
  o.lengths = {64};
  try {
    build_niah_prompts(*tok, "Short hay. Very short.", o);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).find("max_model_len"), std::string::npos) << e.what();
  }
}
