// Scale rules, the store-point observer's statistics and the report format.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "../common/errors.h"
#include "calib/observer.h"
#include "calib/report.h"
#include "calib/scale_rule.h"
#include "io/errors.h"

using namespace fp8kv;
using ::testing::HasSubstr;

TEST(ScaleRule, Parse) {
  EXPECT_EQ(ScaleRule::parse("safety:1.3").kind, ScaleRule::Kind::safety);
  EXPECT_DOUBLE_EQ(ScaleRule::parse("safety:2").margin, 2.0);
  EXPECT_EQ(ScaleRule::parse("safety:1.3").name(), "safety:1.3");
  EXPECT_EQ(ScaleRule::parse("amax").kind, ScaleRule::Kind::amax);
  EXPECT_EQ(ScaleRule::parse("modelopt").name(), "modelopt");
  for (const char* bad : {"safety:0.5", "safety:", "safety:x", "safety:nan", "safety:inf", "safety:1e30", "safety:16.5",
                          "minmax", ""})
    EXPECT_THROW(ScaleRule::parse(bad), std::invalid_argument) << bad;
}

TEST(ScaleRule, Formulas) {
  const auto e4 = KvDtype::fp8_e4m3, e5 = KvDtype::fp8_e5m2;
  const auto safety = ScaleRule::parse("safety:1.3"), amax = ScaleRule::parse("amax"),
             modelopt = ScaleRule::parse("modelopt");
  // Below the range: modelopt keeps unity (its floor); safety and amax have no
  // floor and shrink the scale so that amax lands at M / margin.
  EXPECT_EQ(safety.scale_for(100.0f, e4), ceil_to_bf16(100.0 * 1.3 / 448.0));
  EXPECT_EQ(modelopt.scale_for(100.0f, e4), 1.0f);
  EXPECT_EQ(amax.scale_for(100.0f, e4), ceil_to_bf16(100.0 / 448.0));
  // The bundled model's range (amax ~8): a scale near 0.023, not 1.0.
  EXPECT_NEAR(safety.scale_for(8.0f, e4), 8.0 * 1.3 / 448.0, 8.0 * 1.3 / 448.0 / 128.0);
  // The seed's outlier: max |V| = 1272 -> safety:1.3 gives 1272*1.3/448 = 3.6910714...,
  // rounded up to bf16 (relative step 2^-7).
  const double want = 1272.0 * 1.3 / 448.0;
  EXPECT_NEAR(safety.scale_for(1272.0f, e4), want, want / 128.0);
  EXPECT_GE(static_cast<double>(safety.scale_for(1272.0f, e4)), want);  // rounded up, never down
  EXPECT_EQ(safety.scale_for(1272.0f, e4), round_bf16(safety.scale_for(1272.0f, e4)));
  EXPECT_NEAR(modelopt.scale_for(1272.0f, e4), 1272.0 / 448.0, 1e-6);
  EXPECT_NEAR(safety.scale_for(1e5f, e5), 1e5 * 1.3 / 57344.0, 1e5 * 1.3 / 57344.0 / 128.0);
  EXPECT_EQ(safety.scale_for(1e4f, e5), ceil_to_bf16(1e4 * 1.3 / 57344.0));
  EXPECT_EQ(modelopt.scale_for(1e4f, e5), 1.0f);
  // safety: amax / scale stays within M / margin after rounding.
  for (float a : {1e-3f, 0.37f, 5.0f, 777.0f, 3e5f})
    EXPECT_LE(static_cast<double>(a) / safety.scale_for(a, e4), 448.0 / 1.3 * (1 + 1e-9)) << a;
  // Tiny amax: the scale stays a normal float (1/scale finite), never subnormal.
  EXPECT_GE(safety.scale_for(1e-44f, e4), FLT_MIN);
  EXPECT_GE(amax.scale_for(1e-44f, e4), FLT_MIN);
  // The largest finite amax still gives a finite scale.
  EXPECT_TRUE(std::isfinite(safety.scale_for(FLT_MAX, e4)));
  // amax rule: the smallest bf16 value >= amax / M; amax / scale never exceeds M.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-20.f, 20.f);
  for (int i = 0; i < 2000; ++i) {
    const float a = std::exp2(u(rng));
    const float s = amax.scale_for(a, e4);
    EXPECT_EQ(s, round_bf16(s)) << a;                 // bf16-representable
    EXPECT_GE(static_cast<double>(s), a / 448.0) << a;
    const float below = bf16_to_f32(static_cast<uint16_t>(f32_to_bf16(s) - 1));
    EXPECT_LT(static_cast<double>(below), a / 448.0) << a;  // and the smallest such
    EXPECT_LE(a / s, 448.0f * (1 + 1e-6f));
  }
  EXPECT_EQ(ceil_to_bf16(1.0), 1.0f);
  EXPECT_EQ(ceil_to_bf16(1.0000001), bf16_to_f32(0x3f81));
  EXPECT_GT(ceil_to_bf16(1e-50), 0.0f);
  // amax == 0: unity under every rule.
  for (const auto& r : {safety, amax, modelopt}) EXPECT_EQ(r.scale_for(0.0f, e4), 1.0f);
  EXPECT_THROW(safety.scale_for(NAN, e4), std::invalid_argument);
  EXPECT_THROW(safety.scale_for(1.0f, KvDtype::bf16), std::invalid_argument);
}

TEST(Observer, AmaxPerHeadCountsAndPercentile) {
  CalibrationObserver obs(2);
  // 3 tokens, 2 KV heads, 4 query heads, head_dim 2.
  std::vector<float> q(3 * 4 * 2, 0.5f), k(3 * 2 * 2, 1.0f), v(3 * 2 * 2, 0.25f);
  k[0] = -7.0f;            // token 0, head 0
  v[2 * 4 + 2 + 1] = 900;  // token 2, head 1, d 1
  q[5] = -3.0f;
  obs.observe(1, q.data(), 4, k.data(), v.data(), 2, 2, 3);
  obs.observe(1, q.data(), 4, k.data(), v.data(), 2, 2, 1);  // a decode step: 1 token
  EXPECT_EQ(obs.layer(0).tokens, 0u);
  const LayerStats& s = obs.layer(1);
  EXPECT_EQ(s.tokens, 4u);
  EXPECT_EQ(s.observe_calls, 2u);
  EXPECT_EQ(s.k.head_amax, (std::vector<float>{7.0f, 1.0f}));
  EXPECT_EQ(s.v.head_amax, (std::vector<float>{0.25f, 900.0f}));
  EXPECT_EQ(s.v.amax(), 900.0f);
  EXPECT_EQ(s.q.amax(), 3.0f);
  EXPECT_EQ(s.v.values, 16u);
  EXPECT_THROW(obs.observe(2, q.data(), 4, k.data(), v.data(), 2, 2, 1), std::out_of_range);
}

TEST(Observer, PercentileWithinDocumentedBound) {
  // 1e6 values; compare with the exact nearest-rank percentile.
  std::mt19937 rng(3);
  std::lognormal_distribution<float> ln(0.0f, 1.5f);
  const int n = 1000000;
  std::vector<float> x(n);
  for (auto& e : x) e = ln(rng) * ((rng() & 1) ? 1.f : -1.f);
  StreamStats st;
  st.add(x.data(), n, 1, 1);
  std::vector<float> a(n);
  for (int i = 0; i < n; ++i) a[i] = std::fabs(x[i]);
  std::sort(a.begin(), a.end());
  for (double p : {0.5, 0.99, 0.9999, 1.0}) {
    const size_t rank = static_cast<size_t>(std::ceil(p * n));
    const float exact = a[rank - 1];
    const float got = st.percentile(p);
    EXPECT_GE(got, exact) << p;
    EXPECT_LE(got, exact * (1.0f + 1.0f / 128)) << p;
  }
  EXPECT_EQ(st.percentile(1.0), a.back());  // clamped to the exact amax
}

TEST(Observer, NonFiniteIsCountedNotInAmax) {
  StreamStats st;
  const float x[4] = {1.0f, NAN, -INFINITY, -2.0f};
  st.add(x, 1, 1, 4);
  EXPECT_EQ(st.nonfinite, 2u);
  EXPECT_EQ(st.amax(), 2.0f);
}

namespace {
CalibrationObserver observed(int layers, float v_peak_layer1) {
  CalibrationObserver obs(layers);
  std::vector<float> q(2 * 4 * 2, 1.0f), k(2 * 2 * 2, 2.0f), v(2 * 2 * 2, 3.0f);
  for (int l = 0; l < layers; ++l) {
    std::vector<float> vv = v;
    if (l == 1) vv[3] = v_peak_layer1;
    obs.observe(l, q.data(), 4, k.data(), vv.data(), 2, 2, 2);
  }
  return obs;
}
}  // namespace

TEST(Report, CompleteReportJsonRoundTripsFloat32Bits) {
  const float peak = 1272.3456f;
  const auto obs = observed(3, peak);
  const auto rep = build_report(obs, ScaleRule::parse("safety:1.3"), KvDtype::fp8_e4m3, false);
  ASSERT_TRUE(rep.complete) << rep.reason;
  const auto j = nlohmann::json::parse(rep.to_json().dump());
  EXPECT_EQ(j["status"], "complete");
  EXPECT_EQ(j["rule"], "safety:1.3");
  EXPECT_EQ(j["target"], "fp8_e4m3");
  EXPECT_EQ(j["tokens_observed"], 2);
  ASSERT_EQ(j["layers"].size(), 3u);
  EXPECT_TRUE(j.contains("fp8kv_version"));
  const auto& l1 = j["layers"][1];
  EXPECT_EQ(l1["layer"], 1);
  EXPECT_EQ(l1["observations"], 2);
  EXPECT_EQ(static_cast<float>(l1["v_amax"].get<double>()), peak);
  const float want = ScaleRule::parse("safety:1.3").scale_for(peak, KvDtype::fp8_e4m3);
  EXPECT_EQ(f32_bits(static_cast<float>(l1["v_scale"].get<double>())), f32_bits(want));
  // Layer 0's small amax gets its own floorless scale (no max(1, .) floor).
  const float want0 = ScaleRule::parse("safety:1.3").scale_for(static_cast<float>(j["layers"][0]["v_amax"].get<double>()),
                                                               KvDtype::fp8_e4m3);
  EXPECT_EQ(f32_bits(static_cast<float>(j["layers"][0]["v_scale"].get<double>())), f32_bits(want0));
  for (const char* f : {"q_amax", "k_amax", "q_p9999", "k_p9999", "v_p9999", "q_scale", "k_scale"})
    EXPECT_TRUE(l1.contains(f)) << f;
  // Parsed back for inject: same float bits.
  const auto rs = parse_report_for_inject(j, "R.json", KvScaleShape{3, 4, 2});
  EXPECT_EQ(f32_bits(rs.scales.layers[1].v.values[0]), f32_bits(want));
}

TEST(Report, PerHeadArrays) {
  const auto obs = observed(2, 5000.0f);
  const auto rep = build_report(obs, ScaleRule::parse("amax"), KvDtype::fp8_e4m3, true);
  const auto j = rep.to_json();
  EXPECT_TRUE(j["per_head"].get<bool>());
  const auto& l1 = j["layers"][1];
  ASSERT_TRUE(l1["v_amax"].is_array());
  ASSERT_EQ(l1["v_amax"].size(), 2u);
  ASSERT_EQ(l1["q_scale"].size(), 4u);
  EXPECT_EQ(l1["v_amax"][1].get<double>(), 5000.0);  // index 3 = token 0, head 1, d 1
  EXPECT_EQ(l1["v_amax"][0].get<double>(), 3.0);
  EXPECT_TRUE(l1["v_p9999"].is_number());
  const auto rs = parse_report_for_inject(j, "R.json", KvScaleShape{2, 4, 2});
  EXPECT_EQ(rs.scales.layers[1].v.values.size(), 2u);
  EXPECT_EQ(rs.scales.layers[1].v.values[1], ceil_to_bf16(5000.0 / 448.0));
}

TEST(Report, FailedWhenLayerUnobservedEmptyOrNonFinite) {
  CalibrationObserver empty(2);
  auto r = build_report(empty, ScaleRule{}, KvDtype::fp8_e4m3, false);
  EXPECT_FALSE(r.complete);
  EXPECT_NE(r.reason.find("no token"), std::string::npos);
  auto j = r.to_json();
  EXPECT_EQ(j["status"], "failed");
  EXPECT_TRUE(j["reason"].is_string());

  CalibrationObserver partial(3);
  std::vector<float> q(8, 1.f), k(4, 1.f), v(4, 1.f);
  partial.observe(0, q.data(), 4, k.data(), v.data(), 2, 2, 1);
  partial.observe(2, q.data(), 4, k.data(), v.data(), 2, 2, 1);
  r = build_report(partial, ScaleRule{}, KvDtype::fp8_e4m3, false);
  EXPECT_FALSE(r.complete);
  EXPECT_NE(r.reason.find("layer(s) 1 were never observed"), std::string::npos) << r.reason;

  CalibrationObserver nan_obs(1);
  v[1] = NAN;
  nan_obs.observe(0, q.data(), 4, k.data(), v.data(), 2, 2, 1);
  r = build_report(nan_obs, ScaleRule{}, KvDtype::fp8_e4m3, false);
  EXPECT_FALSE(r.complete);
  EXPECT_NE(r.reason.find("layer 0 V"), std::string::npos) << r.reason;
  // A failed report still dumps (no NaN in JSON).
  EXPECT_NO_THROW(r.to_json().dump());
}

namespace {
nlohmann::json good_report() {
  return nlohmann::json::parse(R"({"status": "complete", "target": "fp8_e4m3", "rule": "safety:1.3", "layers": [
      {"layer": 0, "k_scale": 1.0, "v_scale": 2.5, "q_scale": 1.0},
      {"layer": 1, "k_scale": [1.0, 2.0], "v_scale": 3.0, "q_scale": 1.0}]})");
}
void expect_bad(const nlohmann::json& j, const std::string& needle) {
  EXPECT_THAT(test_util::input_error_of([&] { parse_report_for_inject(j, "R.json", KvScaleShape{2, 4, 2}); }),
              HasSubstr(needle));
}
}  // namespace

TEST(Report, InjectRefusesBadReports) {
  EXPECT_NO_THROW(parse_report_for_inject(good_report(), "R.json", KvScaleShape{2, 4, 2}));
  auto j = good_report();
  j["status"] = "failed";
  j["reason"] = "layer(s) 1 were never observed";
  expect_bad(j, "status is 'failed': layer(s) 1 were never observed");
  j = good_report();
  j["layers"].erase(1);
  expect_bad(j, "1 layer entries, but the model has 2 layers");
  j = good_report();
  j["layers"][1]["v_scale"] = 0.0;
  expect_bad(j, "layers[1] (layer 1).v_scale is 0");
  j = good_report();
  j["layers"][1]["v_scale"] = -1.0;
  expect_bad(j, "v_scale is -1");
  j = good_report();
  j["layers"][0]["k_scale"] = nullptr;  // what a NaN becomes in many JSON writers
  expect_bad(j, "layers[0] (layer 0).k_scale is null");
  j = good_report();
  j["layers"][0]["k_scale"] = "1.0";
  expect_bad(j, "k_scale is string");
  j = good_report();
  j["layers"][0]["k_scale"] = 1e39;
  expect_bad(j, "overflows float32");
  j = good_report();
  j["layers"][0]["k_scale"] = 1e-50;
  expect_bad(j, "underflows float32");
  j = good_report();
  j["layers"][1]["k_scale"] = {1.0, 2.0, 3.0};
  expect_bad(j, "k_scale has 3 values");
  j = good_report();
  j["layers"][1]["k_scale"] = {1.0, std::numeric_limits<double>::infinity()};
  expect_bad(j, "k_scale[1] is not finite");
  j = good_report();
  j["layers"][1]["layer"] = 0;
  expect_bad(j, "layer 0 appears twice");
  j = good_report();
  j["layers"][1].erase("q_scale");
  expect_bad(j, "missing field q_scale");
  j = good_report();
  j["target"] = "bf16";
  expect_bad(j, "target must be fp8");
}

// A hybrid (qwen3_5: layers 0-2 linear_attention, layer 3 full_attention):
// only layer 3 has a KV cache, so only layer 3 is observed and reported
// (docs/design.md "KV scales of hybrid models").
namespace {
const KvScaleShape kHybrid{4, 4, 2, {false, false, false, true}};
}  // namespace

TEST(Report, HybridReportsTheKvLayersOnly) {
  CalibrationObserver obs(4, kHybrid.kv_cache);
  std::vector<float> q(8, 1.f), k(4, 2.f), v(4, 3.f);
  obs.observe(3, q.data(), 4, k.data(), v.data(), 2, 2, 1);
  const auto r = build_report(obs, ScaleRule{}, KvDtype::fp8_e4m3, false);
  EXPECT_TRUE(r.complete) << r.reason;
  ASSERT_EQ(r.layers.size(), 1u);
  EXPECT_EQ(r.layers[0].layer, 3);
  const auto j = r.to_json();
  ASSERT_EQ(j["layers"].size(), 1u);
  EXPECT_EQ(j["layers"][0]["layer"], 3);
  // inject reads it back onto layer 3; the linear layers stay without scales.
  const auto rs = parse_report_for_inject(j, "R.json", kHybrid);
  ASSERT_EQ(rs.scales.layers.size(), 4u);
  EXPECT_EQ(rs.scales.layers[3].v.values[0], ScaleRule{}.scale_for(3.f, KvDtype::fp8_e4m3));
  EXPECT_EQ(rs.scales.layers[0].v.values[0], 1.0f);

  // The KV layer unobserved: failed, naming it (and not the linear layers).
  CalibrationObserver none(4, kHybrid.kv_cache);
  CalibrationObserver only_bad(4, std::vector<bool>{false, true, false, true});
  only_bad.observe(3, q.data(), 4, k.data(), v.data(), 2, 2, 1);
  const auto r2 = build_report(only_bad, ScaleRule{}, KvDtype::fp8_e4m3, false);
  EXPECT_FALSE(r2.complete);
  EXPECT_NE(r2.reason.find("layer(s) 1 were never observed"), std::string::npos) << r2.reason;
  EXPECT_FALSE(build_report(none, ScaleRule{}, KvDtype::fp8_e4m3, false).complete);
  // A store at a layer without a KV cache is an engine bug, not data.
  EXPECT_THROW(obs.observe(0, q.data(), 4, k.data(), v.data(), 2, 2, 1), std::logic_error);
  EXPECT_THROW(CalibrationObserver(4, std::vector<bool>{true}), std::invalid_argument);
}

TEST(Report, HybridInjectRefusesEntriesForLinearLayersAndMissingKvLayers) {
  auto entry = [](int l) { return nlohmann::json{{"layer", l}, {"k_scale", 1.0}, {"v_scale", 2.0}, {"q_scale", 1.0}}; };
  nlohmann::json j = {{"status", "complete"}, {"target", "fp8_e4m3"}, {"layers", nlohmann::json::array()}};
  auto refused = [&](const std::string& needle) {
    EXPECT_THAT(test_util::input_error_of([&] { parse_report_for_inject(j, "R.json", kHybrid); }), HasSubstr(needle));
  };
  refused("0 layer entries, but the model has 1 layers with a KV cache");
  for (int l = 0; l < 4; ++l) j["layers"].push_back(entry(l));  // a dense-style report: every layer
  refused("layers[0]: layer 0 is a linear_attention layer: it has no KV cache");
  j["layers"] = {entry(2)};
  refused("layer 2 is a linear_attention layer");
  j["layers"] = {entry(3)};
  EXPECT_NO_THROW(parse_report_for_inject(j, "R.json", kHybrid));
}
