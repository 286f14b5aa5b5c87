// FP8-weight checkpoints against transformers (tests/golden/fp8_weights/,
// written by tools/gen_fp8_weight_goldens.py on the GPU machine): Llama and
// Qwen3 in every format, a Qwen3.5 hybrid (Gated DeltaNet projections fp8)
// block-wise, and the bundled model quantized block-wise.
//
// Tolerances. The references run transformers in fp32 on the weights
// dequantized in Python exactly as the engine dequantizes them (float32(q) *
// scale, one fp32 multiply), K/V rounded to bf16 at the cache write (the
// engine's bf16 cache). So per position: the fp32 tolerance of
// test_goldens.cpp scaled by the longest reduction, 1e-4 (K_max / 128)
// (1 + |lp|), plus the bf16 cache's whole effect max |ref(fp32 cache) -
// ref(bf16 cache)| (a K/V element on a rounding boundary may round the other
// way here). W8A8 adds the whole activation-rounding effect max |ref(w8a8) -
// ref(w8a16)| for the same reason (an activation on an e4m3 boundary).
//
// Qwen3.5 (qwen3_5_block), as test_goldens_qwen3_5.cpp derives its band:
// K_max also counts the Gated DeltaNet's reductions, value_dim = Hv x Dv
// (out_proj's K; the generator's max_reduction counts it, and the test takes
// the larger of that and the engine's own value_dim); the delta rule's
// chunked form reassociates its sums differently from transformers' torch
// rule, by at most (C + 4 Dk + 8) (chunks + 1) 2^-24 of the largest state or
// value magnitude (test_gdn.cpp; C = 64, Dk = 32, two chunks: 3.6e-5),
// inside the same 1e-4 (K_max / 128) budget, as there. And the conv inputs:
// the reference rounds in_proj_qkv's output to bf16 as the engine's bf16
// conv state does, and an input whose f32 value sits within a few ulps of a
// bf16 midpoint may round the other way here (the engine sums in another
// order), so the band adds max |ref(tie flip) - ref| of the mode's reference
// ("w8a16_tie_flip" / "w8a8_tie_flip": every conv input within TIE_BITS of a
// midpoint rounded to the other neighbour, tools/gen_gdn_goldens.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace fp8kv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

double max_gap(const json& a, const json& b) {
  double m = 0;
  for (size_t s = 0; s < a.size(); ++s)
    for (size_t i = 1; i < a[s].size(); ++i) m = std::max(m, std::fabs(a[s][i].get<double>() - b[s][i].get<double>()));
  return m;
}

class Fp8WeightGolden : public ::testing::TestWithParam<std::tuple<std::string, Fp8Compute>> {};

TEST_P(Fp8WeightGolden, MatchesTransformers) {
  const auto [name, mode] = GetParam();
  const fs::path dir = fs::path(FP8KV_SOURCE_DIR) / "tests/golden/fp8_weights" / name;
  if (!fs::exists(dir / "golden.json"))
    GTEST_SKIP() << "golden files missing in " << dir
                 << ": run `python3 tools/gen_fp8_weight_goldens.py` from the repo root on the GPU machine";
  std::ifstream in(dir / "golden.json");
  const json g = json::parse(in);
  EngineOptions o;
  o.backend = BackendChoice::cpu;
  o.kv_cache_dtype = "bf16";
  o.max_model_len = 256;  // the checkpoints' max_position_embeddings; sequences of 40 and 56 tokens (qwen3_5: 48, 100)
  o.kv_memory_bytes = 64u << 20;
  o.fp8_weight_mode = mode;
  auto e = Engine::load(dir, o);
  const bool w8a8 = mode == Fp8Compute::w8a8;
  const std::string ref_key = w8a8 ? "w8a8" : "w8a16";
  const json& ref = g[ref_key];
  const double kv_band = max_gap(g["w8a16_fp32_kv"], g["w8a16"]);
  const double act_band = w8a8 ? max_gap(g["w8a8"], g["w8a16"]) : 0.0;
  const ModelConfig& c = e->config();
  const bool gdn = c.gdn.has_value();
  EXPECT_EQ(gdn, g["family"] == "qwen3_5") << name;
  const std::string flip_key = ref_key + "_tie_flip";
  if (gdn) {
    ASSERT_TRUE(g.contains(flip_key)) << dir << ": no " << flip_key << "; rerun the generator";
  }
  const double tie_band = gdn ? max_gap(g[flip_key], ref) : 0.0;
  const double k =
      std::max(g["max_reduction"].get<double>(), gdn ? static_cast<double>(c.gdn->value_dim()) : 0.0) / 128.0;
  double sum = 0;
  int64_t n = 0;
  for (size_t s = 0; s < g["sequences"].size(); ++s) {
    const auto ids = g["sequences"][s].get<std::vector<int>>();
    const ScoreResult r = e->score(ids, {}, nullptr);
    for (size_t i = 1; i < ids.size(); ++i) {
      const double want = ref[s][i].get<double>(), got = *r.logprobs[i];
      const double tol = 1e-4 * k * (1 + std::fabs(want)) + kv_band + act_band + tie_band;
      EXPECT_NEAR(got, want, tol) << name << " " << fp8_compute_name(mode) << " seq " << s << " pos " << i;
      sum += std::fabs(got - want);
      ++n;
    }
  }
  RecordProperty("mean_abs_dlogprob", std::to_string(sum / static_cast<double>(n)));
  RecordProperty("bf16_weights_gap", std::to_string(max_gap(g["w8a16_bf16_weights"], g["w8a16"])));
  if (gdn) RecordProperty("tie_band", std::to_string(tie_band));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Fp8WeightGolden,
    ::testing::Combine(::testing::Values("llama_block", "llama_ct_channel", "llama_ct_tensor", "llama_modelopt",
                                         "qwen3_block", "qwen3_ct_channel", "qwen3_ct_tensor", "qwen3_modelopt",
                                         "qwen3_5_block", "fp8kv_mini_block"),
                       ::testing::Values(Fp8Compute::w8a16, Fp8Compute::w8a8)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + std::string(fp8_compute_name(std::get<1>(info.param)));
    });

}  // namespace
}  // namespace fp8kv
