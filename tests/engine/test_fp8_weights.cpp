// FP8-weight checkpoints on the CPU backend (docs/design.md "FP8-weight
// checkpoints"): every format against its f32 twin (tests/engine/
// fp8_checkpoint.h), the W8A8 GEMM against a double-precision reference,
// dummy weights, and the refusals (exit 2 on the CLI: InputError here).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "../common/temp_dir.h"
#include "backend/backend.h"
#include "engine/engine.h"
#include "fp8_checkpoint.h"
#include "io/errors.h"
#include "model/config.h"
#include "model/weights.h"
#include "io/checkpoint.h"
#include "numerics/fp8.h"

namespace fp8kv {
namespace {

using testing::Fp8CheckpointOptions;
using testing::Fp8Format;
using testing::find_tensor;
using testing::fp8_engine_options;
using testing::write_fp8_checkpoint;

std::vector<int> test_tokens(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> t(n);
  for (auto& x : t) x = 3 + static_cast<int>(rng() % 200);
  return t;
}

std::vector<double> logprobs(const std::filesystem::path& dir, const EngineOptions& o, const std::vector<int>& ids) {
  auto e = Engine::load(dir, o);
  const ScoreResult r = e->score(ids, {}, nullptr);
  std::vector<double> out;
  for (size_t i = 1; i < r.logprobs.size(); ++i) out.push_back(*r.logprobs[i]);
  return out;
}

// Each test gets the parameters' fp8 checkpoint in fp8_dir().
class Fp8Twin : public ::testing::TestWithParam<std::tuple<std::string, Fp8Format>> {
 protected:
  void SetUp() override {
    std::tie(opts_.family, opts_.format) = GetParam();
    write_fp8_checkpoint(fp8_dir(), opts_);
  }
  std::filesystem::path fp8_dir() const { return tmp_.path() / "fp8"; }
  test_util::TempDir tmp_;
  Fp8CheckpointOptions opts_;
};

// W8A16 dequantizes each weight tile to exactly the twin's f32 values
// (e4m3(q) * scale, one fp32 multiply in both) and runs the same sgemm
// calls on them, so the logprobs are bitwise equal: tolerance 0.
TEST_P(Fp8Twin, W8A16EqualsDequantizedF32Twin) {
  Fp8CheckpointOptions o = opts_;
  o.twin = true;
  write_fp8_checkpoint(tmp_.path() / "twin", o);
  const auto ids = test_tokens(20, 3);
  const auto a = logprobs(fp8_dir(), fp8_engine_options(), ids);
  const auto b = logprobs(tmp_.path() / "twin", fp8_engine_options(), ids);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "position " << i + 1;
}

// W8A8 rounds every GEMM input to e4m3 (its arithmetic is checked op by op
// against a derived bound in Fp8Linear below). Here: the engine runs it
// (the logprobs move away from W8A16's, all finite); the mean shift is
// recorded, not bounded (on these random tiny models, 0.07-0.12 nats).
TEST_P(Fp8Twin, W8A8RunsAndDiffersFromW8A16) {
  const auto ids = test_tokens(20, 4);
  const auto a = logprobs(fp8_dir(), fp8_engine_options(Fp8Compute::w8a8), ids);
  const auto b = logprobs(fp8_dir(), fp8_engine_options(Fp8Compute::w8a16), ids);
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i])) << "position " << i + 1;
    sum += std::fabs(a[i] - b[i]);
  }
  const double mean = sum / static_cast<double>(a.size());
  RecordProperty("mean_abs_dlogprob_w8a8_vs_w8a16", std::to_string(mean));
  EXPECT_GT(mean, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Twin,
                         ::testing::Combine(::testing::Values("llama", "qwen3", "qwen3_5"),
                                            ::testing::Values(Fp8Format::block, Fp8Format::ct_channel,
                                                              Fp8Format::ct_tensor, Fp8Format::modelopt)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + testing::fp8_format_name(std::get<1>(info.param));
                         });

// The CPU linear on an fp8 weight against a double-precision reference built
// from the definitions (numerics/fp8_weights.h): W8A16 y = sum x * e4m3(q) s_w;
// W8A8 y = sum_g s_x(g) s_w(g) sum_{c in g} e4m3(qx) e4m3(q), qx =
// e4m3(x / s_x), s_x = amax_g / 448. The CPU computes each product from two
// fp32-rounded factors and accumulates K of them in fp32: |err| <= (K + 3)
// 2^-24 sum |terms|.
TEST(Fp8Linear, MatchesDoubleReferenceInBothModes) {
  const int64_t T = 5, N = 200, K = 300;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(N * K), x(T * K);
  for (auto& v : w) v = nd(rng) * 0.05f;
  for (auto& v : x) v = nd(rng);
  x[7] = 40.0f;  // one outlier: its group's scale is large
  const ModelConfig cfg = testing::tiny_config("llama");
  for (ScaleGranularity g : {ScaleGranularity::tensor, ScaleGranularity::channel, ScaleGranularity::block128}) {
    const Fp8QuantizedWeight q = quantize_weight_e4m3(w.data(), N, K, g);
    const auto [sr, sc] = fp8_scale_shape(g, N, K);
    (void)sr;
    auto ws = [&](int64_t r, int64_t c) {
      return g == ScaleGranularity::tensor    ? q.scales[0]
             : g == ScaleGranularity::channel ? q.scales[r]
                                              : q.scales[(r / 128) * sc + c / 128];
    };
    for (Fp8Compute mode : {Fp8Compute::w8a16, Fp8Compute::w8a8}) {
      auto be = make_cpu_backend(cfg, BackendOptions{});
      Tensor W{const_cast<uint8_t*>(q.q.data()), ScalarType::u8, N, K, Fp8WeightScales{q.scales.data(), g, mode}};
      std::vector<float> xin = x, y(T * N);
      Tensor X{xin.data(), ScalarType::f32, T, K}, Y{y.data(), ScalarType::f32, T, N};
      be->linear(X, W, Tensor{}, Y);
      const int64_t group = mode == Fp8Compute::w8a8 ? fp8_activation_group(g, K) : 0;
      for (int64_t t = 0; t < T; ++t) {
        // The activations as the mode sees them (double, from the definition).
        std::vector<double> xa(K);
        for (int64_t c0 = 0; c0 < K; c0 += group ? group : K) {
          const int64_t c1 = std::min(K, c0 + (group ? group : K));
          float amax = 0;
          for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[t * K + c]));
          const float sx = amax / 448.0f;
          for (int64_t c = c0; c < c1; ++c)
            xa[c] = group ? static_cast<double>(e4m3_to_f32(f32_to_e4m3(x[t * K + c] / sx))) * sx : x[t * K + c];
        }
        for (int64_t r = 0; r < N; ++r) {
          double ref = 0, mag = 0;
          for (int64_t c = 0; c < K; ++c) {
            const double term = xa[c] * static_cast<double>(e4m3_to_f32(q.q[r * K + c])) * ws(r, c);
            ref += term;
            mag += std::fabs(term);
          }
          const double tol = (K + 3) * std::ldexp(1.0, -24) * mag;
          ASSERT_NEAR(y[t * N + r], ref, tol) << scale_granularity_name(g) << " " << fp8_compute_name(mode)
                                              << " t=" << t << " r=" << r;
        }
      }
      EXPECT_EQ(xin, x) << "linear must not modify its input";
    }
  }
}

// --load-format dummy with a quantization_config: the projections become
// fp8 (quantized dummy values), so the logprobs differ from the bf16 dummy
// run, and the model still runs.
TEST(Fp8Dummy, QuantizationConfigMakesFp8DummyWeights) {
  test_util::TempDir tmp;
  for (const char* name : {"bf16", "fp8"}) {
    std::filesystem::create_directories(tmp.path() / name);
    nlohmann::json j = testing::fp8_test_config("qwen3");
    if (std::string(name) == "fp8") j["quantization_config"] = testing::fp8_quant_json(Fp8Format::block);
    atomic_write_file(tmp.path() / name / "config.json", j.dump());
  }
  EngineOptions o = fp8_engine_options();
  o.load_format = LoadFormat::dummy;
  const auto ids = test_tokens(12, 5);
  const auto a = logprobs(tmp.path() / "fp8", o, ids);
  const auto b = logprobs(tmp.path() / "bf16", o, ids);
  bool differ = false;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i]));
    differ = differ || a[i] != b[i];
  }
  EXPECT_TRUE(differ);
  o.fp8_weight_mode = Fp8Compute::w8a8;
  for (double v : logprobs(tmp.path() / "fp8", o, ids)) EXPECT_TRUE(std::isfinite(v));
}

// ---- refusals: each names the field or tensor and what is supported ----

void expect_refused(const Fp8CheckpointOptions& o, const std::vector<std::string>& needles,
                    EngineOptions eo = fp8_engine_options()) {
  test_util::TempDir tmp;
  write_fp8_checkpoint(tmp.path(), o);
  try {
    Engine::load(tmp.path(), eo);
    ADD_FAILURE() << "loaded; expected an error containing " << needles[0];
  } catch (const InputError& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

Fp8CheckpointOptions mutated(Fp8Format f,
                             std::function<void(std::vector<TensorToWrite>&, nlohmann::json&, nlohmann::json&)> m) {
  Fp8CheckpointOptions o;
  o.format = f;
  o.mutate = std::move(m);
  return o;
}

const std::string kQ = "model.layers.0.self_attn.q_proj";

TEST(Fp8Refusal, MissingScale) {
  expect_refused(mutated(Fp8Format::block,
                         [](auto& ts, auto&, auto&) {
                           std::erase_if(ts, [](const TensorToWrite& t) { return t.name == kQ + ".weight_scale_inv"; });
                         }),
                 {"missing tensor " + kQ + ".weight_scale_inv", "block 128x128"});
}

TEST(Fp8Refusal, NaNScale) {
  expect_refused(mutated(Fp8Format::block,
                         [](auto& ts, auto&, auto&) {
                           const float nan = std::nanf("");
                           std::memcpy(find_tensor(ts, kQ + ".weight_scale_inv").data.data() + 4, &nan, 4);
                         }),
                 {kQ + ".weight_scale_inv", "NaN at element 1", "finite and > 0"});
}

TEST(Fp8Refusal, NonPositiveScale) {
  for (float bad : {0.0f, -0.5f})
    expect_refused(mutated(Fp8Format::modelopt,
                           [bad](auto& ts, auto&, auto&) {
                             std::memcpy(find_tensor(ts, kQ + ".weight_scale").data.data(), &bad, 4);
                           }),
                   {kQ + ".weight_scale", "finite and > 0"});
}

TEST(Fp8Refusal, BadInputScale) {
  expect_refused(mutated(Fp8Format::ct_tensor,
                         [](auto& ts, auto&, auto&) {
                           const float inf = INFINITY;
                           std::memcpy(find_tensor(ts, kQ + ".input_scale").data.data(), &inf, 4);
                         }),
                 {kQ + ".input_scale", "finite and > 0"});
}

TEST(Fp8Refusal, ScaleShapeMismatch) {
  // Block scales [2][2] written as [4][1]; channel scales [N][1] as [1].
  expect_refused(mutated(Fp8Format::block,
                         [](auto& ts, auto&, auto&) { find_tensor(ts, kQ + ".weight_scale_inv").shape = {4, 1}; }),
                 {kQ + ".weight_scale_inv", "has shape [4, 1], expected [2, 2]"});
  expect_refused(mutated(Fp8Format::ct_channel,
                         [](auto& ts, auto&, auto&) {
                           auto& t = find_tensor(ts, kQ + ".weight_scale");
                           t.shape = {1};
                           t.data.resize(2);
                         }),
                 {kQ + ".weight_scale", "expected [160, 1] or [160]"});
}

TEST(Fp8Refusal, UnquantizedWeightWhereConfigQuantizes) {
  expect_refused(mutated(Fp8Format::block,
                         [](auto& ts, auto&, auto&) {
                           auto& t = find_tensor(ts, kQ + ".weight");
                           t.dtype = DType::F32;
                           t.data.resize(t.data.size() * 4);
                         }),
                 {kQ + ".weight has dtype F32, expected F8_E4M3", "modules_to_not_convert"});
}

TEST(Fp8Refusal, Fp8WeightInExcludedModule) {
  expect_refused(mutated(Fp8Format::modelopt,
                         [](auto&, auto&, auto& q) {
                           q["quantization"]["exclude_modules"] = {"lm_head", "model.layers.0.self_attn.q_*"};
                         }),
                 {kQ + ".weight is F8_E4M3", "exclude_modules"});
}

TEST(Fp8Refusal, Fp8WeightWithoutQuantizationConfig) {
  expect_refused(mutated(Fp8Format::block, [](auto&, auto&, auto& q) { q = {{"kv_cache_scheme", nullptr}}; }),
                 {"is F8_E4M3 but config.json declares no weight quantization"});
}

TEST(Fp8Refusal, UnsupportedSchemes) {
  struct Case {
    const char* quant;  // quantization_config as JSON
    std::vector<std::string> needles;
  };
  const Case cases[] = {
      {R"({"quant_method": "gptq", "bits": 4})", {"quantization_config.quant_method", "'gptq' is not supported"}},
      {R"({"quant_method": "awq", "bits": 4})", {"'awq' is not supported", "supported weight quantizations"}},
      {R"({"quant_method": "fp8", "weight_block_size": [64, 64]})",
       {"quantization_config.weight_block_size", "[64,64] is not supported", "[128, 128]"}},
      {R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})",
       {"quantization_config.fmt", "e5m2"}},
      {R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0":
           {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}})",
       {"quantization_config.format", "'pack-quantized' is not supported"}},
      {R"({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0":
           {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group"}}}})",
       {"config_groups.group_0.weights.num_bits", "NVFP4"}},
      {R"({"quant_method": "modelopt", "quant_algo": "NVFP4"})", {"quantization_config.quant_algo", "'NVFP4'"}},
  };
  for (const auto& c : cases)
    expect_refused(mutated(Fp8Format::block,
                           [q = nlohmann::json::parse(c.quant)](auto&, auto&, auto& quant) { quant = q; }),
                   c.needles);
}

// TP > 1 runs (test_tp_qwen3_5_fp8.cpp) when every rank's cut of a
// block-scaled matrix is whole 128 blocks; this checkpoint's q_proj has 160
// rows, 80 per rank at TP 2: refused before any weight is read.
TEST(Fp8Refusal, BlockShardsOffA128Boundary) {
  EngineOptions o = fp8_engine_options();
  o.tensor_parallel_size = 2;
  expect_refused(Fp8CheckpointOptions{},
                 {"--tensor-parallel-size 2: fp8 weight model.layers.0.self_attn.q_proj.weight [160, 160] has 128x128 "
                  "block scales, and rank 0's column-parallel shard of it, rows [0, 80), does not start and end on a "
                  "128-row block boundary"},
                 o);
}

TEST(Fp8Refusal, CudaW8A8ForNow) {
  if (resolve_backend(BackendChoice::auto_) != BackendKind::cuda)
    GTEST_SKIP() << "no CUDA device: the cuda refusal is not reachable here";
  EngineOptions o = fp8_engine_options();
  o.backend = BackendChoice::cuda;
  o.fp8_weight_mode = Fp8Compute::w8a8;
  expect_refused(Fp8CheckpointOptions{}, {"--fp8-weight-mode w8a8 runs on --backend cpu for now"}, o);
}

// first_nan_fp8 (what the CUDA backend refuses at upload, since its fp8 GEMV
// reads NaN bytes as finite values): the first fp8 matrix in forward order
// holding an e4m3 NaN byte, either sign, named with the element; none in a
// clean checkpoint; f32 tensors are not its business.
TEST(Fp8Weights, FirstNanFp8NamesTheMatrixAndElement) {
  test_util::TempDir tmp;
  const auto scan = [&](std::function<void(std::vector<TensorToWrite>&)> edit) {
    std::filesystem::remove_all(tmp.path() / "ckpt");
    Fp8CheckpointOptions o;
    o.mutate = [&](auto& ts, auto&, auto&) { if (edit) edit(ts); };
    write_fp8_checkpoint(tmp.path() / "ckpt", o);
    const ModelConfig cfg = load_model_config(tmp.path() / "ckpt");
    return ModelWeights::load(Checkpoint::open(tmp.path() / "ckpt"), cfg)->first_nan_fp8();
  };
  EXPECT_EQ(scan(nullptr), std::nullopt);
  for (uint8_t nan : {uint8_t{0x7f}, uint8_t{0xff}}) {
    const auto r = scan([&](auto& ts) {
      find_tensor(ts, "model.layers.1.mlp.gate_proj.weight").data[4101] = std::byte{nan};
      // f32 NaNs (a norm, and the matrix the block format leaves f32): not fp8, not scanned here.
      const float f32_nan = std::nanf("");
      std::memcpy(find_tensor(ts, "model.layers.0.input_layernorm.weight").data.data(), &f32_nan, 4);
      std::memcpy(find_tensor(ts, "model.layers.1.mlp.down_proj.weight").data.data() + 8, &f32_nan, 4);
    });
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(*r, "model.layers.1.mlp.gate_proj.weight (layer 1) holds NaN at element 4101");
  }
}

}  // namespace
}  // namespace fp8kv
