// `--load-format dummy` on Qwen3.5 (Gated DeltaNet + gated full attention):
// the dummy model holds exactly the tensors, with exactly the shapes, that
// the checkpoint loader binds for the same config (the transformers-written
// goldens under tests/golden/models_qwen3_5 are the independent reference),
// its Gated DeltaNet values follow the documented init (docs/engine.md
// "Dummy weights"), the CPU engine runs it from config.json alone and
// deterministically, and the matrix ids of every other model are unchanged
// (the Gated DeltaNet ids are appended after them).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <vector>

#include "../common/temp_dir.h"
#include "engine/dummy_weights.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/weights.h"
#include "io/errors.h"
#include "kv/planner.h"
#include "numerics/fp8.h"
#include "hf_golden.h"
#include "reference.h"
#include "weights_compare.h"

namespace fp8kv {
namespace {

namespace fs = std::filesystem;

const char* kCases[] = {"l3f1_hd64", "l2f1_hd64", "l1f1_hd256"};

using testing::kLayerMatrices;
using testing::kLayerVectors;

bool present(const WeightMatrix& m) { return m.data != nullptr || m.dummy; }

void expect_same_matrix_shape(const WeightMatrix& want, const WeightMatrix& got, const std::string& what) {
  EXPECT_EQ(present(want), present(got)) << what;
  if (!present(want)) return;
  EXPECT_EQ(want.rows, got.rows) << what;
  EXPECT_EQ(want.cols, got.cols) << what;
  EXPECT_EQ(want.fp8, got.fp8) << what;
}

// Every tensor of `got` exists in `want` with its shape, and vice versa.
void expect_same_tensors(const ModelWeights& want, const ModelWeights& got, const std::string& tag) {
  expect_same_matrix_shape(want.embed, got.embed, tag + " embed");
  ASSERT_EQ(want.lm_head.has_value(), got.lm_head.has_value()) << tag;
  if (want.lm_head) expect_same_matrix_shape(*want.lm_head, *got.lm_head, tag + " lm_head");
  EXPECT_EQ(want.final_norm.size(), got.final_norm.size()) << tag;
  ASSERT_EQ(want.layers.size(), got.layers.size()) << tag;
  for (size_t l = 0; l < want.layers.size(); ++l) {
    for (const auto& [n, m] : kLayerMatrices)
      expect_same_matrix_shape(want.layers[l].*m, got.layers[l].*m, tag + " layer " + std::to_string(l) + " " + n);
    for (const auto& [n, v] : kLayerVectors)
      EXPECT_EQ((want.layers[l].*v).size(), (got.layers[l].*v).size())
          << tag << " layer " << l << " " << n;
  }
}

bool bitwise_equal(const WeightMatrix& a, const WeightMatrix& b) {
  if (!a.bf16 || !b.bf16 || a.rows != b.rows || a.cols != b.cols) return false;
  const auto* p = static_cast<const uint16_t*>(a.data);
  const auto* q = static_cast<const uint16_t*>(b.data);
  for (int64_t i = 0; i < a.rows * a.cols; ++i)
    if (p[i] != q[i]) return false;
  return true;
}

WeightMatrix full(uint64_t seed, uint64_t id, int64_t rows, int64_t cols) {
  return dummy_matrix_block(seed, id, rows, cols, 0, rows, 0, cols);
}

// The dummy model has the loader's tensors and shapes: host matrices bf16
// with data, lazy ones descriptors (no data) of the same shapes.
TEST(DummyQwen3_5, SameTensorsAndShapesAsTheCheckpointLoader) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    const ModelConfig cfg = load_model_config(testing::qwen3_5_golden_dir(name));
    ASSERT_TRUE(cfg.gdn.has_value());
    ASSERT_TRUE(cfg.attn_output_gate);
    std::shared_ptr<const Checkpoint> ckpt = Checkpoint::open(testing::qwen3_5_golden_dir(name));
    const auto real = ModelWeights::load(ckpt, cfg);
    const auto host = dummy_weights(cfg, 0);
    const auto lazy = dummy_weights(cfg, 0, 0.02f, /*lazy=*/true);
    expect_same_tensors(*real, *host, "host");
    expect_same_tensors(*real, *lazy, "lazy");
    int linear = 0;
    for (int l = 0; l < cfg.num_layers; ++l) {
      for (const auto& [n, m] : kLayerMatrices) {
        const WeightMatrix& h = host->layers[l].*m;
        const WeightMatrix& z = lazy->layers[l].*m;
        if (!present(h)) continue;
        EXPECT_TRUE(h.bf16 && h.data && !h.dummy) << l << " " << n;
        EXPECT_TRUE(z.bf16 && !z.data && z.dummy) << l << " " << n;
      }
      // Vectors are the same on both paths.
      for (const auto& [n, v] : kLayerVectors) EXPECT_EQ(host->layers[l].*v, lazy->layers[l].*v) << l << " " << n;
      linear += cfg.is_linear(l);
    }
    EXPECT_GT(linear, 0);
    EXPECT_LT(linear, cfg.num_layers);
  }
}

// Matrix ids: embed 0, lm_head 1 (untied), layer l's q..down at
// 2 + 7l + k (a linear layer leaves its q, k, v, o ids unused), then the
// Gated DeltaNet tensors of layer l at 2 + 7L + 7l + j. Written out here
// rather than through dummy_layer_matrix_id, so that a change of the order
// shows.
TEST(DummyQwen3_5, MatrixIdsAreAppendedAfterEveryLayers) {
  const ModelConfig cfg = load_model_config(testing::qwen3_5_golden_dir("l3f1_hd64"));
  ASSERT_FALSE(cfg.tie_word_embeddings);
  const int64_t L = cfg.num_layers, H = cfg.hidden_size, I = cfg.intermediate_size;
  const GatedDeltaNetConfig& g = *cfg.gdn;
  const auto host = dummy_weights(cfg, 5);
  const auto lazy = dummy_weights(cfg, 5, 0.02f, true);
  EXPECT_TRUE(bitwise_equal(host->embed, full(5, 0, cfg.vocab_size, H)));
  EXPECT_TRUE(bitwise_equal(*host->lm_head, full(5, 1, cfg.vocab_size, H)));
  for (int64_t l = 0; l < L; ++l) {
    SCOPED_TRACE(l);
    const LayerWeights& w = host->layers[l];
    const LayerWeights& z = lazy->layers[l];
    const uint64_t a = 2 + 7 * l;
    EXPECT_EQ(dummy_layer_matrix_id(cfg, static_cast<int>(l), 0), a);
    EXPECT_TRUE(bitwise_equal(w.gate_proj, full(5, a + 4, I, H)));
    EXPECT_TRUE(bitwise_equal(w.up_proj, full(5, a + 5, I, H)));
    EXPECT_TRUE(bitwise_equal(w.down_proj, full(5, a + 6, H, I)));
    EXPECT_EQ(z.down_proj.dummy_key, dummy_matrix_key(5, a + 6));
    if (!cfg.is_linear(static_cast<int>(l))) {
      const int64_t qd = cfg.num_heads * cfg.head_dim, kd = cfg.num_kv_heads * cfg.head_dim;
      EXPECT_TRUE(bitwise_equal(w.q_proj, full(5, a + 0, 2 * qd, H)));  // query rows and gate rows
      EXPECT_TRUE(bitwise_equal(w.k_proj, full(5, a + 1, kd, H)));
      EXPECT_TRUE(bitwise_equal(w.v_proj, full(5, a + 2, kd, H)));
      EXPECT_TRUE(bitwise_equal(w.o_proj, full(5, a + 3, H, qd)));
      EXPECT_EQ(z.q_proj.dummy_key, dummy_matrix_key(5, a));
      continue;
    }
    const uint64_t b = 2 + 7 * L + 7 * l;
    EXPECT_EQ(dummy_gdn_matrix_id(cfg, static_cast<int>(l)), b);
    EXPECT_TRUE(bitwise_equal(w.in_proj_qkv, full(5, b + 0, g.conv_dim(), H)));
    EXPECT_TRUE(bitwise_equal(w.in_proj_z, full(5, b + 1, g.value_dim(), H)));
    EXPECT_TRUE(bitwise_equal(w.in_proj_b, full(5, b + 2, g.num_v_heads, H)));
    EXPECT_TRUE(bitwise_equal(w.in_proj_a, full(5, b + 3, g.num_v_heads, H)));
    EXPECT_TRUE(bitwise_equal(w.out_proj, full(5, b + 4, H, g.value_dim())));
    const uint64_t keys[] = {z.in_proj_qkv.dummy_key, z.in_proj_z.dummy_key, z.in_proj_b.dummy_key,
                             z.in_proj_a.dummy_key, z.out_proj.dummy_key};
    for (uint64_t j = 0; j < 5; ++j) EXPECT_EQ(keys[j], dummy_matrix_key(5, b + j)) << j;
    // conv1d: dummy matrix b + 5 ([C][K], bf16 values) as f32.
    const WeightMatrix conv = full(5, b + 5, g.conv_dim(), g.conv_kernel);
    ASSERT_EQ(static_cast<int64_t>(w.conv1d.size()), g.conv_dim() * g.conv_kernel);
    for (size_t e = 0; e < w.conv1d.size(); ++e)
      ASSERT_EQ(w.conv1d[e], bf16_to_f32(static_cast<const uint16_t*>(conv.data)[e])) << e;
  }
}

// The Gated DeltaNet values: A = exp(A_log) in [1, 16) and spread over it
// (distinct per head and layer), dt_bias and the gated norm exactly 1, the
// conv and projections N(0, 0.02); the zero-centred norms hold 1 as applied
// (the loader's 1 + w with w = 0).
TEST(DummyQwen3_5, GatedDeltaNetValuesFollowTheInit) {
  const ModelConfig cfg = load_model_config(testing::qwen3_5_golden_dir("l3f1_hd64"));
  const auto w = dummy_weights(cfg, 0);
  std::set<float> a_logs;
  double conv_sq = 0.0, conv_sum = 0.0;
  int64_t conv_n = 0;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const LayerWeights& L = w->layers[l];
    for (float x : L.input_norm) ASSERT_EQ(x, 1.0f);
    for (float x : L.post_attention_norm) ASSERT_EQ(x, 1.0f);
    if (!cfg.is_linear(l)) {
      for (float x : L.q_norm) ASSERT_EQ(x, 1.0f);
      continue;
    }
    for (float x : L.A_log) {
      EXPECT_GE(std::exp(x), 1.0f - 1e-6f);
      EXPECT_LT(std::exp(x), 16.0f * (1 + 1e-6f));
      a_logs.insert(x);
    }
    for (float x : L.dt_bias) EXPECT_EQ(x, 1.0f);
    for (float x : L.gdn_norm) EXPECT_EQ(x, 1.0f);
    for (float x : L.conv1d) {
      conv_sum += x;
      conv_sq += static_cast<double>(x) * x;
      ++conv_n;
    }
  }
  const int64_t linear = 3;
  EXPECT_EQ(a_logs.size(), static_cast<size_t>(linear * cfg.gdn->num_v_heads));  // no repeats
  // 3 x 768 conv taps: the sample sd of n normals is within 5 x sd / sqrt(2n) of 0.02.
  const double n = static_cast<double>(conv_n), mean = conv_sum / n, sd = std::sqrt(conv_sq / n - mean * mean);
  EXPECT_NEAR(sd, 0.02, 5 * 0.02 / std::sqrt(2 * n));
  EXPECT_NEAR(mean, 0.0, 5 * 0.02 / std::sqrt(n));
}

// Every parameter of a model: its matrices' and vectors' elements.
uint64_t count_parameters(const ModelWeights& w) {
  uint64_t n = static_cast<uint64_t>(w.embed.rows * w.embed.cols + w.final_norm.size());
  if (w.lm_head) n += static_cast<uint64_t>(w.lm_head->rows * w.lm_head->cols);
  for (const LayerWeights& L : w.layers) {
    for (const auto& [name, m] : kLayerMatrices)
      if (present(L.*m)) n += static_cast<uint64_t>((L.*m).rows * (L.*m).cols);
    for (const auto& [name, v] : kLayerVectors) n += (L.*v).size();
  }
  return n;
}

// capacity's config-only parameter estimate counts the gated q_proj and the
// Gated DeltaNet tensors: equal to the elements of every tensor in the
// transformers-written checkpoints, and to the dummy model's count.
TEST(DummyQwen3_5, ParameterEstimateCountsEveryCheckpointTensor) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    const ModelConfig cfg = load_model_config(testing::qwen3_5_golden_dir(name));
    const auto ckpt = Checkpoint::open(testing::qwen3_5_golden_dir(name));
    uint64_t n = 0;
    for (const std::string& t : ckpt->tensor_names()) n += static_cast<uint64_t>(ckpt->view(t).numel());
    EXPECT_EQ(estimate_parameters(cfg), n);
    EXPECT_EQ(count_parameters(*dummy_weights(cfg, 0)), n);
  }
  const ModelConfig big = load_model_config(fs::path(FP8KV_SOURCE_DIR) / "tests/data/configs/qwen3.5-27b");
  EXPECT_EQ(estimate_parameters(big), count_parameters(*dummy_weights(big, 0, 0.02f, true)));
}

// The CPU engine runs the dummy model from config.json alone: generation,
// finite logprobs, and two loads agree bitwise.
TEST(DummyQwen3_5, EngineRunsFromConfigAloneAndIsDeterministic) {
  for (const char* name : {"l3f1_hd64", "l1f1_hd256"}) {
    SCOPED_TRACE(name);
    test_util::TempDir dir;
    fs::copy_file(testing::qwen3_5_golden_dir(name) / "config.json", dir.path() / "config.json");
    EngineOptions o;
    o.backend = BackendChoice::cpu;
    o.max_model_len = 64;
    o.kv_memory_bytes = 8u << 20;
    o.max_num_seqs = 4;
    EXPECT_THROW(Engine::load(dir.path(), o), InputError);  // auto: needs the safetensors
    o.load_format = LoadFormat::dummy;
    auto a = Engine::load(dir.path(), o);
    auto b = Engine::load(dir.path(), o);
    ASSERT_TRUE(a->config().gdn.has_value());
    GenerateOptions g;
    g.max_tokens = 8;
    g.stop_at_eos = false;
    const std::vector<int> prompt = {5, 9, 13, 17, 21, 25, 29};
    const GenerateResult ra = a->generate(prompt, g), rb = b->generate(prompt, g);
    EXPECT_EQ(ra.tokens.size(), 8u);
    EXPECT_EQ(ra.tokens, rb.tokens);
    const ScoreResult sa = a->score(prompt), sb = b->score(prompt);
    for (size_t i = 1; i < prompt.size(); ++i) {
      ASSERT_TRUE(sa.logprobs[i].has_value());
      EXPECT_TRUE(std::isfinite(*sa.logprobs[i])) << i;
      EXPECT_LE(*sa.logprobs[i], 0.0);
      EXPECT_EQ(*sa.logprobs[i], *sb.logprobs[i]) << i;
    }
  }
}

// Models without Gated DeltaNet layers keep their ids and values: every
// matrix equals dummy matrix <its documented id>, and the generator's key
// of ids 0, 2, 9 at seed 0 is the value it had (the splitmix64 finalizer
// written out by hand).
TEST(DummyWeights, OtherModelsKeepTheirMatrixIds) {
  EXPECT_EQ(dummy_matrix_key(0, 0), 0xa706dd2f4d197e6full);
  EXPECT_EQ(dummy_matrix_key(0, 2), 0x64684c4f0fd784b4ull);
  EXPECT_EQ(dummy_matrix_key(0, 9), 0xe58df79ac22c328eull);
  for (const char* family : {"llama", "qwen2", "qwen3", "gemma3"}) {
    SCOPED_TRACE(family);
    const ModelConfig c = testing::tiny_config(family);
    const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
    const int64_t qd = c.num_heads * D, kd = c.num_kv_heads * D;
    const auto w = dummy_weights(c, 0);
    const auto z = dummy_weights(c, 0, 0.02f, true);
    EXPECT_TRUE(bitwise_equal(w->embed, full(0, 0, c.vocab_size, H)));
    uint64_t id = 1;
    if (!c.tie_word_embeddings) {
      EXPECT_TRUE(bitwise_equal(*w->lm_head, full(0, 1, c.vocab_size, H)));
      id = 2;
    }
    for (int l = 0; l < c.num_layers; ++l, id += 7) {
      const LayerWeights& L = w->layers[l];
      EXPECT_TRUE(bitwise_equal(L.q_proj, full(0, id + 0, qd, H))) << l;
      EXPECT_TRUE(bitwise_equal(L.k_proj, full(0, id + 1, kd, H))) << l;
      EXPECT_TRUE(bitwise_equal(L.v_proj, full(0, id + 2, kd, H))) << l;
      EXPECT_TRUE(bitwise_equal(L.o_proj, full(0, id + 3, H, qd))) << l;
      EXPECT_TRUE(bitwise_equal(L.gate_proj, full(0, id + 4, I, H))) << l;
      EXPECT_TRUE(bitwise_equal(L.up_proj, full(0, id + 5, I, H))) << l;
      EXPECT_TRUE(bitwise_equal(L.down_proj, full(0, id + 6, H, I))) << l;
      EXPECT_EQ(z->layers[l].q_proj.dummy_key, dummy_matrix_key(0, id)) << l;
      EXPECT_FALSE(present(L.in_proj_qkv));
      EXPECT_TRUE(L.conv1d.empty() && L.A_log.empty());
    }
  }
}

// The Qwen3.5-27B shape (tests/data/configs/qwen3.5-27b, the multimodal
// checkpoint's layout) parses as 48 Gated DeltaNet + 16 gated full-attention
// layers, and its lazy dummy model (descriptors only: no matrix is made)
// has the checkpoint's tensor sizes.
TEST(DummyQwen3_5, TwentySevenBShapeDescriptors) {
  const ModelConfig cfg = load_model_config(fs::path(FP8KV_SOURCE_DIR) / "tests/data/configs/qwen3.5-27b");
  ASSERT_TRUE(cfg.gdn.has_value());
  EXPECT_EQ(cfg.num_layers, 64);
  EXPECT_EQ(cfg.num_attention_layers(), 16);
  EXPECT_TRUE(cfg.attn_output_gate);
  const auto z = dummy_weights(cfg, 0, 0.02f, true);
  EXPECT_EQ(z->layers[0].in_proj_qkv.rows, 2 * 16 * 128 + 48 * 128);
  EXPECT_EQ(z->layers[3].q_proj.rows, 2 * 24 * 256);
  EXPECT_EQ(z->layers[0].conv1d.size(), static_cast<size_t>((2 * 16 * 128 + 48 * 128) * 4));
  // Parameters: the text model of Qwen3.5-27B (27B less the vision tower).
  const double params = static_cast<double>(z->matrix_bytes()) / 2.0;
  EXPECT_GT(params, 25e9);
  EXPECT_LT(params, 28e9);
}

}  // namespace
}  // namespace fp8kv
