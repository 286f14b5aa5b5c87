// Calibration end to end on a tiny llama with a planted V outlier in layer 1:
// calibrate finds the layer (and only it leaves unity), inject writes the
// scales, and an fp8 run with the injected scales is measurably closer to the
// bf16 run than the fp8 run at unity scales.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>

#include "calib/calibrate.h"
#include "calib/inject.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "tiny_checkpoint.h"
#include "../engine/fp8_checkpoint.h"
#include "../common/temp_dir.h"

namespace fs = std::filesystem;
using namespace fp8kv;

namespace {

using fp8kv::test_util::TempDir;
using fp8kv::testing::random_token_seqs;

// All logits of all positions of the sequences.
std::vector<float> all_logits(Engine& e, const std::vector<std::vector<int>>& seqs) {
  std::vector<float> out;
  for (const auto& s : seqs)
    e.score(s, {}, [&](int, std::span<const float> l) { out.insert(out.end(), l.begin(), l.end()); });
  return out;
}

double rms_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s / static_cast<double>(a.size()));
}

EngineOptions opts(const char* dtype) {
  EngineOptions o;
  o.kv_cache_dtype = dtype;
  o.max_model_len = 256;
  o.kv_memory_bytes = 8u << 20;
  o.num_threads = 1;
  return o;
}

}  // namespace

TEST(CalibrateE2E, FindsPlantedOutlierAndCalibratedFp8IsCloserToBf16) {
  TempDir d;
  const fs::path m = d.path() / "m", out = d.path() / "calibrated";
  fp8kv::testing::write_tiny_checkpoint(m, {.outlier_layer = 1, .outlier_gain = 2000.0f, .outlier_all_rows = true});

  auto bf16 = Engine::load(m, opts("bf16"));
  const auto corpus = random_token_seqs(4, 48, 11);
  CalibrateOptions co;  // safety:1.3, e4m3
  uint64_t last_done = 0;
  const CalibrationReport rep = calibrate(*bf16, corpus, co, [&](uint64_t done, uint64_t total) {
    EXPECT_GT(done, last_done);
    EXPECT_EQ(total, 4u * 48u);
    last_done = done;
  });
  ASSERT_TRUE(rep.complete) << rep.reason;
  EXPECT_EQ(rep.tokens_observed, 4u * 48u);
  ASSERT_EQ(rep.layers.size(), 3u);
  for (const auto& l : rep.layers) EXPECT_EQ(l.observations, 4u * 48u) << l.layer;
  // The outlier layer exceeds e4m3 at unity and gets v_scale > 1; the others
  // get their own amax * 1.3 / 448 (below 1: the default rule has no floor).
  EXPECT_GT(rep.layers[1].v_amax[0], 448.0f);
  EXPECT_GT(rep.layers[1].v_scale[0], 1.0f);
  const double want1 = rep.layers[1].v_amax[0] * 1.3 / 448.0;
  EXPECT_NEAR(rep.layers[1].v_scale[0], want1, want1 / 128.0);  // rounded up to bf16
  for (int l : {0, 2}) {
    EXPECT_EQ(rep.layers[l].v_scale[0], ceil_to_bf16(rep.layers[l].v_amax[0] * 1.3 / 448.0)) << l;
    EXPECT_LT(rep.layers[l].v_scale[0], 1.0f) << l;
  }
  EXPECT_LT(rep.layers[0].v_amax[0], 100.0f);
  EXPECT_LE(rep.layers[1].v_p9999, rep.layers[1].v_amax[0]);
  const std::string summary = calibration_summary(rep);
  EXPECT_NE(summary.find(": above 1.0 in 1 of 3 layers: 1, below 1.0 in 2, exactly 1.0 in 0"), std::string::npos)
      << summary;
  EXPECT_NE(summary.find("(V at layer 1)"), std::string::npos) << summary;

  // Inject into a new directory and read the scales back.
  InjectOptions io;
  io.model_dir = m;
  io.output_dir = out;
  inject_kv_scales(io, rep.to_json());
  const auto ck = Checkpoint::open(out);
  const KvScales scales = load_kv_scales(*ck, KvScaleShape{3, 4, 2});
  EXPECT_EQ(scales.layers[1].v.values[0], rep.layers[1].v_scale[0]);

  // bf16 reference vs fp8 at unity vs fp8 with the calibrated scales.
  const auto eval = random_token_seqs(3, 64, 99);
  const auto ref = all_logits(*bf16, eval);
  auto unity = Engine::load(m, opts("fp8_e4m3"));
  auto calibrated = Engine::load(out, opts("fp8_e4m3"));
  calibrated->set_kv_scales(scales);  // explicit (independent of the engine's own loading)
  const double err_unity = rms_diff(all_logits(*unity, eval), ref);
  const double err_cal = rms_diff(all_logits(*calibrated, eval), ref);
  std::printf("layer 1 v_amax %.1f -> v_scale %.4f; logit RMS error vs bf16: unity %.5f, calibrated %.5f\n",
              rep.layers[1].v_amax[0], rep.layers[1].v_scale[0], err_unity, err_cal);
  EXPECT_LT(err_cal, 0.5 * err_unity) << "calibrated " << err_cal << " vs unity " << err_unity;
}

TEST(CalibrateE2E, RefusesQuantizedEngineAndEmptyCorpusFails) {
  TempDir d;
  const fs::path m = d.path() / "m";
  fp8kv::testing::write_tiny_checkpoint(m);
  auto fp8 = Engine::load(m, opts("fp8"));
  EXPECT_THROW(calibrate(*fp8, random_token_seqs(1, 8, 1), {}), InputError);
  auto bf16 = Engine::load(m, opts("bf16"));
  const auto rep = calibrate(*bf16, {}, {});
  EXPECT_FALSE(rep.complete);
  EXPECT_EQ(rep.to_json()["status"], "failed");
}

TEST(CalibrateChunks, ContextAndBudget) {
  std::vector<std::vector<int>> c;
  uint64_t budget = 0;
  append_chunks({1, 2, 3, 4, 5, 6, 7}, 3, budget, false, c);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[2], std::vector<int>{7});
  c.clear();
  budget = 5;
  append_chunks({1, 2, 3, 4}, 3, budget, true, c);
  append_chunks({5, 6, 7, 8}, 3, budget, true, c);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[1], std::vector<int>{4});
  EXPECT_EQ(c[2], std::vector<int>{5});
  EXPECT_EQ(budget, 0u);
}

// FP8-weight checkpoints (issue 32's toolchain items): calibrate runs on the
// fp8 weights (W8A16, bf16 cache), inject writes the KV scales in place
// without touching a weight shard (every shard's SHA-256 unchanged), and
// the injected checkpoint loads with an fp8 cache and the report's scales.
TEST(CalibrateE2E, Fp8WeightCheckpointsCalibrateAndInjectInPlace) {
  using namespace fp8kv::testing;
  for (Fp8Format f : {Fp8Format::block, Fp8Format::ct_channel, Fp8Format::modelopt}) {
    TempDir d;
    const fs::path m = d.path() / "m";
    write_fp8_checkpoint(m, Fp8CheckpointOptions{.format = f});
    const std::string before = sha256sums_manifest(m);
    auto bf16 = Engine::load(m, opts("bf16"));
    const CalibrationReport rep = calibrate(*bf16, random_token_seqs(3, 32, 5), CalibrateOptions{});
    ASSERT_TRUE(rep.complete) << fp8_format_name(f) << ": " << rep.reason;
    InjectOptions io;
    io.model_dir = m;
    const InjectResult r = inject_kv_scales(io, rep.to_json());
    // Every file that was there before is byte-identical; the scales are new files.
    const std::string after = sha256sums_manifest(m);
    std::istringstream lines(before);
    for (std::string line; std::getline(lines, line);)
      EXPECT_NE(after.find(line), std::string::npos) << fp8_format_name(f) << ": changed or gone: " << line;
    auto fp8 = Engine::load(m, opts("fp8_e4m3"));
    const auto ck = Checkpoint::open(m);
    const ModelConfig cfg = load_model_config(m);
    const KvScales scales =
        load_kv_scales(*ck, KvScaleShape{cfg.num_layers, cfg.num_heads, cfg.num_kv_heads});
    for (size_t l = 0; l < rep.layers.size(); ++l) {
      EXPECT_EQ(scales.layers[l].k.values[0], rep.layers[l].k_scale[0]) << fp8_format_name(f) << " layer " << l;
      EXPECT_EQ(scales.layers[l].v.values[0], rep.layers[l].v_scale[0]) << fp8_format_name(f) << " layer " << l;
    }
    const std::vector<int> ids = {1, 5, 9, 13, 17, 21};
    const ScoreResult s = fp8->score(ids, {}, nullptr);
    for (size_t i = 1; i < s.logprobs.size(); ++i) EXPECT_TRUE(std::isfinite(*s.logprobs[i])) << i;
  }
}

// Qwen3.5 hybrids (docs/design.md "KV scales of hybrid models"): on the
// tiny golden (layers 0-2 linear_attention, layer 3 full_attention) in both
// layouts, calibrate observes and reports layer 3 alone, inject writes its
// k/v scales only, under the prefix the checkpoint's attention weights use
// (`model.` for Qwen3_5ForCausalLM, `model.language_model.` for
// Qwen3_5ForConditionalGeneration), weights untouched, and an fp8 engine
// loads them without a coverage warning.
TEST(CalibrateE2E, Qwen3_5HybridKvLayersOnlyBothLayouts) {
  using fp8kv::testing::write_qwen3_5_checkpoint;
  if (!fs::exists(fp8kv::testing::qwen3_5_golden_dir() / "model.safetensors")) GTEST_SKIP() << "no golden";
  for (const bool cond : {false, true}) {
    SCOPED_TRACE(cond ? "Qwen3_5ForConditionalGeneration" : "Qwen3_5ForCausalLM");
    TempDir d;
    const fs::path m = d.path() / "m", out = d.path() / "out";
    write_qwen3_5_checkpoint(m, cond);
    const std::string weights = sha256_file_hex(m / "model.safetensors");
    auto bf16 = Engine::load(m, opts("bf16"));
    ASSERT_EQ(bf16->config().num_attention_layers(), 1);
    std::mt19937_64 rng(7);
    std::vector<std::vector<int>> corpus(2);
    for (auto& c : corpus)
      for (int i = 0; i < 40; ++i) c.push_back(static_cast<int>(rng() % 256));
    const CalibrationReport rep = calibrate(*bf16, corpus, CalibrateOptions{});
    ASSERT_TRUE(rep.complete) << rep.reason;
    ASSERT_EQ(rep.layers.size(), 1u);
    EXPECT_EQ(rep.layers[0].layer, 3);
    EXPECT_EQ(rep.layers[0].observations, 80u);
    EXPECT_GT(rep.layers[0].v_amax[0], 0.0f);

    InjectOptions io;
    io.model_dir = m;
    io.output_dir = out;
    io.naming = KvScaleNaming::vllm_runtime;
    io.write_q_scale = false;
    const InjectResult r = inject_kv_scales(io, rep.to_json());
    const std::string p = cond ? "model.language_model." : "model.";
    EXPECT_EQ(r.tensors, (std::vector<std::string>{p + "layers.3.self_attn.attn.k_scale",
                                                   p + "layers.3.self_attn.attn.v_scale"}));
    EXPECT_EQ(sha256_file_hex(out / "model.safetensors"), weights);
    EXPECT_EQ(sha256_file_hex(m / "model.safetensors"), weights);

    const auto ck = Checkpoint::open(out);
    const KvScaleShape shape = kv_scale_shape(bf16->config());
    const KvScales scales = load_kv_scales(*ck, shape);
    EXPECT_EQ(scales.layers[3].v.values[0], rep.layers[0].v_scale[0]);
    EXPECT_EQ(scales.layers[3].k.values[0], rep.layers[0].k_scale[0]);
    for (int l = 0; l < 3; ++l) EXPECT_FALSE(scales.layers[l].v.from_checkpoint) << l;
    EXPECT_TRUE(kv_scale_coverage(scales, shape).v_missing.empty());

    ::testing::internal::CaptureStderr();
    auto fp8 = Engine::load(out, opts("fp8_e4m3"));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(err.find("v_scale for"), std::string::npos) << err;
    EXPECT_EQ(fp8->kv_scales().layers[3].v.values[0], rep.layers[0].v_scale[0]);
    EXPECT_TRUE(fp8->kv_scales().layers[3].v.from_checkpoint);
    // The hf naming and in place: the same prefix rule, q included.
    io.output_dir.reset();
    io.naming = KvScaleNaming::hf;
    io.write_q_scale = true;
    EXPECT_EQ(inject_kv_scales(io, rep.to_json()).tensors,
              (std::vector<std::string>{p + "layers.3.self_attn.k_scale", p + "layers.3.self_attn.v_scale",
                                        p + "layers.3.self_attn.q_scale"}));
  }
}
