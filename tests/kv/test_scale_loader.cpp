// KV scale loading: every naming convention, validation by tensor name,
// coverage by presence, and the auto kv-cache-dtype resolution.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "../common/errors.h"
#include "io/checkpoint.h"
#include "io/errors.h"
#include "io/safetensors.h"
#include "kv/scale_loader.h"
#include "model/config.h"
#include "../common/temp_dir.h"

namespace fs = std::filesystem;
using namespace fp8kv;
using ::testing::AllOf;
using ::testing::HasSubstr;

namespace {

struct TempDir : fp8kv::test_util::TempDir {
  TempDir() : fp8kv::test_util::TempDir("fp8kv_scale_loader_") {}
};

constexpr KvScaleShape kShape{/*num_layers=*/4, /*num_heads=*/8, /*num_kv_heads=*/2};

// A checkpoint with one weight per layer plus the given extra tensors.
std::unique_ptr<Checkpoint> make_ckpt(const fs::path& dir, std::vector<TensorToWrite> extra) {
  std::vector<TensorToWrite> t;
  const float w[4] = {0.5f, -1.f, 2.f, 0.25f};
  for (int l = 0; l < kShape.num_layers; ++l)
    t.push_back(make_f32_tensor("model.layers." + std::to_string(l) + ".self_attn.q_proj.weight", {2, 2}, w));
  for (auto& e : extra) t.push_back(std::move(e));
  write_safetensors(dir / "model.safetensors", t);
  return Checkpoint::open(dir);
}

TensorToWrite scalar(const std::string& name, float v, std::vector<int64_t> shape = {}) {
  return make_f32_tensor(name, std::move(shape), std::span<const float>(&v, 1));
}

// Expects load_kv_scales to throw InputError whose message contains every needle.
void expect_refused(std::vector<TensorToWrite> extra, const std::vector<std::string>& needles) {
  TempDir d;
  auto ck = make_ckpt(d.path(), std::move(extra));
  try {
    load_kv_scales(*ck, kShape);
    FAIL() << "expected InputError mentioning " << needles[0];
  } catch (const InputError& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(KvScaleName, ParsesEveryConvention) {
  struct Case {
    const char* name;
    int layer;
    ScaleStream stream;
  } cases[] = {
      {"model.layers.3.self_attn.k_scale", 3, ScaleStream::k},
      {"model.layers.3.self_attn.v_scale", 3, ScaleStream::v},
      {"model.layers.3.self_attn.q_scale", 3, ScaleStream::q},
      {"model.layers.12.self_attn.attn.k_scale", 12, ScaleStream::k},
      {"model.layers.12.self_attn.attn.v_scale", 12, ScaleStream::v},
      {"model.layers.12.self_attn.attn.q_scale", 12, ScaleStream::q},
      {"model.layers.0.self_attn.k_proj.output_scale", 0, ScaleStream::k},
      {"model.layers.0.self_attn.v_proj.output_scale", 0, ScaleStream::v},
      {"model.layers.0.self_attn.q_proj.output_scale", 0, ScaleStream::q},
      {"model.layers.1.self_attn.k_proj.k_scale", 1, ScaleStream::k},
      {"model.layers.1.self_attn.v_proj.v_scale", 1, ScaleStream::v},
      {"model.layers.2.self_attn.prob_output_scale", 2, ScaleStream::prob},
      {"model.layers.2.self_attn.attn.prob_scale", 2, ScaleStream::prob},
      {"model.layers.5.self_attn.kv_scale", 5, ScaleStream::kv},
      {"model.layers.5.self_attn.attn.kv_scale", 5, ScaleStream::kv},
      {"model.layers.2.self_attn.prob_scale", 2, ScaleStream::prob},
      {"model.language_model.layers.7.self_attn.k_scale", 7, ScaleStream::k},
      {"model.llm.layers.7.self_attn.attn.v_scale", 7, ScaleStream::v},
  };
  for (const auto& c : cases) {
    const auto p = parse_kv_scale_name(c.name);
    ASSERT_TRUE(p) << c.name;
    EXPECT_EQ(p->layer, c.layer) << c.name;
    EXPECT_EQ(p->stream, c.stream) << c.name;
  }
  EXPECT_EQ(parse_kv_scale_name("model.language_model.layers.7.self_attn.k_scale")->prefix, "model.language_model.");
  for (const char* n : {"model.layers.3.self_attn.k_proj.weight", "model.layers.3.self_attn.k_proj.weight_scale",
                        "model.layers.x.self_attn.k_scale", "model.layers.3.mlp.k_scale", "lm_head.weight",
                        "vision_tower.encoder.layers.1.self_attn.k_scale", "model.sublayers.1.self_attn.k_scale"})
    EXPECT_FALSE(parse_kv_scale_name(n)) << n;
}

TEST(KvScaleName, WriteNamesRoundTrip) {
  EXPECT_EQ(kv_scale_tensor_name("model.", 4, ScaleStream::v, KvScaleNaming::hf), "model.layers.4.self_attn.v_scale");
  EXPECT_EQ(kv_scale_tensor_name("model.", 4, ScaleStream::q, KvScaleNaming::vllm_runtime),
            "model.layers.4.self_attn.attn.q_scale");
  EXPECT_EQ(parse_kv_scale_naming("vllm-runtime"), KvScaleNaming::vllm_runtime);
  EXPECT_THROW(parse_kv_scale_naming("vllm"), std::invalid_argument);
  for (auto s : {ScaleStream::k, ScaleStream::v, ScaleStream::q})
    for (auto n : {KvScaleNaming::hf, KvScaleNaming::vllm_runtime}) {
      const auto p = parse_kv_scale_name(kv_scale_tensor_name("model.", 2, s, n));
      ASSERT_TRUE(p);
      EXPECT_EQ(p->stream, s);
      EXPECT_EQ(p->layer, 2);
    }
}

TEST(KvScaleLoader, NoScalesIsUnityWithoutProvenance) {
  TempDir d;
  auto ck = make_ckpt(d.path(), {});
  const KvScales s = load_kv_scales(*ck, kShape);
  ASSERT_EQ(s.layers.size(), 4u);
  for (const auto& l : s.layers) {
    EXPECT_FALSE(l.k.from_checkpoint);
    EXPECT_FALSE(l.v.from_checkpoint);
    EXPECT_EQ(l.v.values, std::vector<float>{1.0f});
  }
  const auto cov = kv_scale_coverage(s);
  EXPECT_EQ(cov.v_present(), 0);
  EXPECT_EQ(cov.v_missing, (std::vector<int>{0, 1, 2, 3}));
}

TEST(KvScaleLoader, MixedConventionsMapToOneKvScales) {
  TempDir d;
  const float kv_heads[2] = {1.5f, 2.5f};
  const float q_heads[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  auto ck = make_ckpt(d.path(), {
                                    scalar("model.layers.0.self_attn.k_scale", 0.25f),
                                    scalar("model.layers.0.self_attn.v_scale", 3.0f, {1}),
                                    scalar("model.layers.1.self_attn.attn.k_scale", 0.5f),
                                    make_f32_tensor("model.layers.1.self_attn.attn.v_scale", {2}, kv_heads),
                                    make_f32_tensor("model.layers.1.self_attn.attn.q_scale", {8}, q_heads),
                                    scalar("model.layers.2.self_attn.k_proj.output_scale", 0.75f),
                                    scalar("model.layers.2.self_attn.v_proj.v_scale", 1.25f),
                                    scalar("model.layers.2.self_attn.q_proj.output_scale", 2.0f),
                                    scalar("model.layers.3.self_attn.kv_scale", 1.0f),
                                    scalar("model.layers.3.self_attn.attn.prob_scale", 1.0f / 448),
                                });
  const KvScales s = load_kv_scales(*ck, kShape);
  EXPECT_EQ(s.layers[0].k.values, std::vector<float>{0.25f});
  EXPECT_EQ(s.layers[0].k.source_tensor, "model.layers.0.self_attn.k_scale");
  EXPECT_EQ(s.layers[0].v.values, std::vector<float>{3.0f});
  EXPECT_FALSE(s.layers[0].q.from_checkpoint);
  EXPECT_EQ(s.layers[1].v.values, (std::vector<float>{1.5f, 2.5f}));
  EXPECT_FLOAT_EQ(s.layers[1].v.at(1), 2.5f);
  EXPECT_EQ(s.layers[1].q.values.size(), 8u);
  EXPECT_EQ(s.layers[1].q.source_tensor, "model.layers.1.self_attn.attn.q_scale");
  EXPECT_EQ(s.layers[2].k.values, std::vector<float>{0.75f});
  EXPECT_EQ(s.layers[2].v.source_tensor, "model.layers.2.self_attn.v_proj.v_scale");
  EXPECT_EQ(s.layers[2].q.values, std::vector<float>{2.0f});
  // Deprecated kv_scale covers both k and v.
  EXPECT_TRUE(s.layers[3].k.from_checkpoint);
  EXPECT_TRUE(s.layers[3].v.from_checkpoint);
  EXPECT_EQ(s.layers[3].v.source_tensor, "model.layers.3.self_attn.kv_scale");
  const auto cov = kv_scale_coverage(s);
  EXPECT_EQ(cov.v_present(), 4);
  EXPECT_EQ(cov.k_present(), 4);
  EXPECT_EQ(cov.q_missing, (std::vector<int>{0, 3}));
}

TEST(KvScaleLoader, Bf16AndF16ScalesConvert) {
  TempDir d;
  TensorToWrite t{"model.layers.0.self_attn.v_scale", DType::BF16, {}, {}};
  const uint16_t b = f32_to_bf16(3.0f);
  t.data.resize(2);
  std::memcpy(t.data.data(), &b, 2);
  auto ck = make_ckpt(d.path(), {std::move(t)});
  EXPECT_EQ(load_kv_scales(*ck, kShape).layers[0].v.values, std::vector<float>{3.0f});
}

TEST(KvScaleLoader, RefusesBadValuesByName) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  expect_refused({scalar("model.layers.1.self_attn.v_scale", nan)}, {"model.layers.1.self_attn.v_scale is NaN"});
  expect_refused({scalar("model.layers.2.self_attn.k_scale", inf)}, {"model.layers.2.self_attn.k_scale is inf"});
  expect_refused({scalar("model.layers.2.self_attn.k_scale", -inf)}, {"model.layers.2.self_attn.k_scale is -inf"});
  expect_refused({scalar("model.layers.0.self_attn.attn.v_scale", 0.0f)}, {"model.layers.0.self_attn.attn.v_scale is 0"});
  expect_refused({scalar("model.layers.0.self_attn.attn.v_scale", -0.0f)}, {"model.layers.0.self_attn.attn.v_scale is 0"});
  expect_refused({scalar("model.layers.3.self_attn.q_scale", -2.0f)}, {"model.layers.3.self_attn.q_scale is negative"});
  expect_refused({scalar("model.layers.3.self_attn.kv_scale", nan)}, {"model.layers.3.self_attn.kv_scale is NaN"});
  expect_refused({scalar("model.layers.3.self_attn.attn.prob_scale", -1.f)}, {"model.layers.3.self_attn.attn.prob_scale"});
  // One bad head in a per-head vector.
  const float heads[2] = {1.0f, nan};
  expect_refused({make_f32_tensor("model.layers.1.self_attn.v_scale", {2}, heads)},
                 {"model.layers.1.self_attn.v_scale[1] is NaN"});
  // A subnormal float32 is finite and > 0, but 1/scale is inf: refused
  // (issue 15 item 4: 1.4e-45, the smallest subnormal, was accepted).
  expect_refused({scalar("model.layers.0.self_attn.v_scale", 1.4e-45f)},
                 {"model.layers.0.self_attn.v_scale is 1.40129846e-45", "subnormal"});
  expect_refused({scalar("model.layers.2.self_attn.k_scale", 1e-40f)}, {"model.layers.2.self_attn.k_scale", "subnormal"});
  // The smallest normal float32 is accepted (with a range warning).
  TempDir d;
  const float tiny = std::numeric_limits<float>::min();
  auto ck = make_ckpt(d.path(), {scalar("model.layers.0.self_attn.v_scale", tiny)});
  std::vector<std::string> warnings;
  EXPECT_EQ(load_kv_scales(*ck, kShape, &warnings).layers[0].v.values[0], tiny);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("model.layers.0.self_attn.v_scale is 1.17549435e-38, outside [2^-20, 2^20]"),
            std::string::npos)
      << warnings[0];
}

TEST(KvScaleLoader, ErrorsNameTheFile) {
  // Issue 15 item 18: the tensor alone does not say which checkpoint is at fault.
  expect_refused({scalar("model.layers.0.self_attn.v_scale", -1.0f)}, {"model.safetensors: model.layers.0.self_attn.v_scale"});
}

TEST(KvScaleLoader, RangeWarningsOnlyOutsideTwoToThePlusMinus20) {
  TempDir d;
  auto ck = make_ckpt(d.path(), {scalar("model.layers.0.self_attn.k_scale", 0x1p-20f),
                                 scalar("model.layers.0.self_attn.v_scale", 0x1p20f),
                                 scalar("model.layers.1.self_attn.k_scale", 0x1.000002p20f),
                                 scalar("model.layers.1.self_attn.v_scale", 0x1.fffffep-21f)});
  std::vector<std::string> warnings;
  load_kv_scales(*ck, kShape, &warnings);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("model.layers.1.self_attn.k_scale is 1048576.12"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("model.layers.1.self_attn.v_scale is 9.5367426e-07"), std::string::npos) << warnings[1];
}

TEST(KvScaleLoader, RefusesBadShapesByName) {
  const float three[3] = {1, 1, 1}, four[4] = {1, 1, 1, 1};
  // k/v per KV head is [2]; [3] and [8] (query heads) are wrong.
  expect_refused({make_f32_tensor("model.layers.1.self_attn.k_scale", {3}, three)},
                 {"model.layers.1.self_attn.k_scale has shape [3]", "KV head [2]"});
  expect_refused({make_f32_tensor("model.layers.1.self_attn.v_scale", {2, 2}, four)},
                 {"model.layers.1.self_attn.v_scale has shape [2, 2]"});
  // q per query head is [8]; [2] is wrong.
  expect_refused({make_f32_tensor("model.layers.1.self_attn.q_scale", {2}, std::span<const float>(four, 2))},
                 {"model.layers.1.self_attn.q_scale has shape [2]", "query head [8]"});
  // Empty tensor.
  expect_refused({make_f32_tensor("model.layers.1.self_attn.v_scale", {0}, std::span<const float>())},
                 {"model.layers.1.self_attn.v_scale has shape [0]"});
}

TEST(KvScaleLoader, RefusesBadDtypeAndLayerByName) {
  TensorToWrite t{"model.layers.0.self_attn.k_scale", DType::I32, {}, std::vector<std::byte>(4)};
  expect_refused({std::move(t)}, {"model.layers.0.self_attn.k_scale has dtype I32"});
  TensorToWrite f8{"model.layers.0.self_attn.k_scale", DType::F8_E4M3, {}, std::vector<std::byte>(1, std::byte{0x38})};
  expect_refused({std::move(f8)}, {"model.layers.0.self_attn.k_scale has dtype F8_E4M3"});
  expect_refused({scalar("model.layers.4.self_attn.v_scale", 1.0f)},
                 {"model.layers.4.self_attn.v_scale names layer 4", "4 layers"});
}

TEST(KvScaleLoader, RefusesConflictingDuplicates) {
  expect_refused({scalar("model.layers.1.self_attn.v_scale", 2.0f), scalar("model.layers.1.self_attn.attn.v_scale", 3.0f)},
                 {"model.layers.1.self_attn.attn.v_scale", "model.layers.1.self_attn.v_scale", "different values"});
  // Agreeing duplicates are accepted.
  TempDir d;
  auto ck = make_ckpt(d.path(), {scalar("model.layers.1.self_attn.v_scale", 2.0f),
                                 scalar("model.layers.1.self_attn.attn.v_scale", 2.0f)});
  EXPECT_EQ(load_kv_scales(*ck, kShape).layers[1].v.values, std::vector<float>{2.0f});
}

TEST(KvScaleCoverage, WarnsOnlyWhenVCoverageIsShortAndFp8) {
  TempDir d;
  auto ck = make_ckpt(d.path(), {scalar("model.layers.0.self_attn.v_scale", 2.0f),
                                 scalar("model.layers.1.self_attn.v_scale", 2.0f),
                                 scalar("model.layers.0.self_attn.k_scale", 2.0f)});
  const auto cov = kv_scale_coverage(load_kv_scales(*ck, kShape));
  EXPECT_EQ(cov.v_present(), 2);
  const auto w = kv_scale_coverage_warning(cov, KvDtype::fp8_e4m3);
  ASSERT_TRUE(w);
  EXPECT_NE(w->find("v_scale"), std::string::npos) << *w;
  EXPECT_NE(w->find("2 of 4"), std::string::npos) << *w;
  EXPECT_NE(w->find("layers 2-3"), std::string::npos) << *w;
  EXPECT_NE(w->find("1.0"), std::string::npos) << *w;
  EXPECT_FALSE(kv_scale_coverage_warning(cov, KvDtype::bf16));
}

TEST(KvScaleCoverage, CompleteCoverageNeverWarnsEvenAtOne) {
  // Calibrated values equal to 1.0 are still present: decided by presence.
  TempDir d;
  std::vector<TensorToWrite> t;
  for (int l = 0; l < 4; ++l) t.push_back(scalar("model.layers." + std::to_string(l) + ".self_attn.v_scale", 1.0f));
  auto ck = make_ckpt(d.path(), std::move(t));
  const auto cov = kv_scale_coverage(load_kv_scales(*ck, kShape));
  EXPECT_EQ(cov.v_present(), 4);
  EXPECT_FALSE(kv_scale_coverage_warning(cov, KvDtype::fp8_e4m3));
  EXPECT_FALSE(kv_scale_coverage_warning(cov, KvDtype::fp8_e5m2));
}

TEST(KvScaleLoader, ForRunWarnsOnceOnStderrNotStdout) {
  TempDir d;
  auto ck = make_ckpt(d.path(), {scalar("model.layers.0.self_attn.v_scale", 2.0f)});
  testing::internal::CaptureStderr();
  testing::internal::CaptureStdout();
  load_kv_scales_for_run(*ck, kShape, KvDtype::fp8_e4m3);
  const std::string out = testing::internal::GetCapturedStdout();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(out.empty()) << out;
  size_t n = 0;
  for (size_t p = err.find("warning:"); p != std::string::npos; p = err.find("warning:", p + 1)) ++n;
  EXPECT_NE(err.find("v_scale"), std::string::npos) << err;
  EXPECT_EQ(n, 1u) << err;
  testing::internal::CaptureStderr();
  load_kv_scales_for_run(*ck, kShape, KvDtype::bf16);
  EXPECT_TRUE(testing::internal::GetCapturedStderr().empty());
}

// A hybrid (qwen3_5: layers 0-2 linear_attention, no KV cache; layer 3
// full_attention): scales cover the KV layers only (docs/design.md "KV scales
// of hybrid models").
namespace {
const KvScaleShape kHybrid{4, 8, 2, {false, false, false, true}};
}  // namespace

TEST(KvScaleCoverage, HybridCountsOnlyLayersWithAKvCache) {
  EXPECT_EQ(kHybrid.num_kv_layers(), 1);
  EXPECT_EQ(kHybrid.kv_layers(), std::vector<int>{3});
  EXPECT_EQ(kShape.num_kv_layers(), 4);
  TempDir d;
  auto ck = make_ckpt(d.path(), {scalar("model.layers.3.self_attn.attn.k_scale", 0.5f),
                                 scalar("model.layers.3.self_attn.attn.v_scale", 0.25f)});
  const KvScales s = load_kv_scales(*ck, kHybrid);
  ASSERT_EQ(s.layers.size(), 4u);  // one entry per model layer: the engine indexes by layer
  EXPECT_EQ(s.layers[3].v.values, std::vector<float>{0.25f});
  const auto cov = kv_scale_coverage(s, kHybrid);
  EXPECT_EQ(cov.quantized_layers, 1);
  EXPECT_EQ(cov.v_present(), 1);
  EXPECT_TRUE(cov.v_missing.empty());
  EXPECT_EQ(cov.q_missing, std::vector<int>{3});
  EXPECT_FALSE(kv_scale_coverage_warning(cov, KvDtype::fp8_e4m3));
  // Counted as if every layer had a KV cache, the linear layers would be "missing".
  EXPECT_EQ(kv_scale_coverage(s).v_missing, (std::vector<int>{0, 1, 2}));

  // No scales at all: the warning names the KV layer, out of 1.
  TempDir d2;
  auto ck2 = make_ckpt(d2.path(), {});
  const auto cov2 = kv_scale_coverage(load_kv_scales(*ck2, kHybrid), kHybrid);
  const auto w = kv_scale_coverage_warning(cov2, KvDtype::fp8_e4m3);
  ASSERT_TRUE(w);
  EXPECT_NE(w->find("v_scale for 0 of 1 quantized layers"), std::string::npos) << *w;
  EXPECT_NE(w->find("(layers 3)"), std::string::npos) << *w;
}

TEST(KvScaleLoader, HybridForRunFullCoverageIsSilent) {
  TempDir d;
  auto ck = make_ckpt(d.path(), {scalar("model.layers.3.self_attn.attn.k_scale", 0.5f),
                                 scalar("model.layers.3.self_attn.attn.v_scale", 0.25f)});
  testing::internal::CaptureStderr();
  const KvScales s = load_kv_scales_for_run(*ck, kHybrid, KvDtype::fp8_e4m3);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(err.empty()) << err;
  EXPECT_TRUE(s.layers[3].v.from_checkpoint);
  EXPECT_NO_THROW(validate_kv_scales(s, kHybrid));
}

TEST(KvScaleLoader, HybridRefusesAScaleForALinearLayer) {
  TempDir d;
  auto ck = make_ckpt(d.path(), {scalar("model.layers.3.self_attn.v_scale", 2.0f),
                                 scalar("model.layers.1.self_attn.v_scale", 2.0f)});
  EXPECT_THAT(test_util::input_error_of([&] { load_kv_scales(*ck, kHybrid); }),
              AllOf(HasSubstr("model.safetensors: model.layers.1.self_attn.v_scale names layer 1, a linear_attention "
                              "layer"),
                    HasSubstr("KV-cache layers: 3")));
  // The dense shape reads the same file without complaint.
  EXPECT_EQ(load_kv_scales(*ck, kShape).layers[1].v.values, std::vector<float>{2.0f});
}

TEST(KvScaleShapeOf, ModelConfigMarksTheLinearLayers) {
  const nlohmann::json q = {{"architectures", {"Qwen3_5ForCausalLM"}},
                            {"model_type", "qwen3_5_text"},
                            {"hidden_size", 64},
                            {"intermediate_size", 128},
                            {"num_hidden_layers", 8},
                            {"num_attention_heads", 4},
                            {"num_key_value_heads", 2},
                            {"head_dim", 64},
                            {"vocab_size", 272},
                            {"linear_num_key_heads", 2},
                            {"linear_num_value_heads", 4},
                            {"linear_key_head_dim", 16},
                            {"linear_value_head_dim", 32}};  // full_attention_interval 4: layers 3 and 7
  const KvScaleShape s = kv_scale_shape(parse_model_config(q, "q.json"));
  EXPECT_EQ(s.num_layers, 8);
  EXPECT_EQ(s.num_kv_heads, 2);
  EXPECT_EQ(s.kv_layers(), (std::vector<int>{3, 7}));
  nlohmann::json l = q;
  l["architectures"] = {"LlamaForCausalLM"};
  l["model_type"] = "llama";
  const KvScaleShape dense = kv_scale_shape(parse_model_config(l, "l.json"));
  EXPECT_TRUE(dense.kv_cache.empty());
  EXPECT_EQ(dense.num_kv_layers(), 8);
}

namespace {
void write_text(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }
}  // namespace

TEST(KvCacheDtype, DeclaredFp8Scheme) {
  TempDir d;
  write_text(d.path() / "config.json", R"({"model_type": "llama"})");
  EXPECT_FALSE(checkpoint_declares_fp8_kv(d.path()));

  write_text(d.path() / "config.json",
             R"({"quantization_config": {"quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}})");
  EXPECT_TRUE(checkpoint_declares_fp8_kv(d.path()));
  // kv_cache_scheme null: not declared.
  write_text(d.path() / "config.json", R"({"quantization_config": {"kv_cache_scheme": null}})");
  EXPECT_FALSE(checkpoint_declares_fp8_kv(d.path()));

  write_text(d.path() / "hf_quant_config.json", R"({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}})");
  EXPECT_TRUE(checkpoint_declares_fp8_kv(d.path()));
  write_text(d.path() / "hf_quant_config.json", R"({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": null}})");
  EXPECT_FALSE(checkpoint_declares_fp8_kv(d.path()));
  write_text(d.path() / "hf_quant_config.json", "{not json");
  EXPECT_THAT(test_util::input_error_of([&] { checkpoint_declares_fp8_kv(d.path()); }),
              HasSubstr("hf_quant_config.json"));
}

// The engine's set_kv_scales and the loader share validate_kv_scales (issue
// 15 "validate scales in one place"): the same value gets the same refusal,
// naming the file and tensor it came from.
TEST(ValidateKvScales, OneRuleNamingFileAndTensor) {
  const KvScaleShape shape{2, 4, 2};
  KvScales s = KvScales::unity(2);
  EXPECT_NO_THROW(validate_kv_scales(s, shape));
  // A float32 subnormal (reciprocal inf): the engine used to accept it (it
  // only asked for finite and > 0), the loader refused it.
  s.layers[1].v.values = {1.4e-45f};
  EXPECT_THAT(test_util::input_error_of([&] { validate_kv_scales(s, shape); }),
              AllOf(HasSubstr("KV scales: layer 1 v_scale is"), HasSubstr("subnormal")));
  s.layers[1].v.source_tensor = "model.layers.1.self_attn.v_scale";
  s.layers[1].v.source_file = "/ckpt/model.safetensors";
  s.layers[1].v.values = {std::numeric_limits<float>::quiet_NaN()};
  EXPECT_THAT(test_util::input_error_of([&] { validate_kv_scales(s, shape); }),
              HasSubstr("/ckpt/model.safetensors: model.layers.1.self_attn.v_scale is NaN"));
  s.layers[1].v.values = {1.0f, 2.0f, 3.0f};  // neither 1 nor 2 KV heads
  EXPECT_THROW(validate_kv_scales(s, shape), InputError);
  s.layers[1].v.values = {1.0f, 2.0f};
  s.layers[0].q.values = {1.0f, 1.0f, 1.0f, 1.0f};  // per query head
  EXPECT_NO_THROW(validate_kv_scales(s, shape));
  EXPECT_THROW(validate_kv_scales(KvScales::unity(3), shape), InputError);
}
