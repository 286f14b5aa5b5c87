// The backend split: CpuBackend storage follows the plan, --load-format
// dummy runs from config.json alone, the backend factory refuses clearly.
#include <gtest/gtest.h>

#include <fstream>

#include "../common/temp_dir.h"
#include "backend/backend.h"
#include "engine/dummy_weights.h"
#include "engine/engine.h"
#include "io/errors.h"
#include "engine_fixtures.h"
#include "kv/kv_cache_manager.h"
#include "reference.h"

namespace fp8kv {
namespace {

using testing::tiny_config;
using testing::tiny_config_json;

// (Moved from tests/kv: the storage is the backend's now.) Layers in
// different groups at the same slot share storage; K and V differ.
TEST(CpuBackend, KvStorageMatchesThePlan) {
  nlohmann::json j = tiny_config_json("qwen3");  // one full and one sliding group
  const ModelConfig c = parse_model_config(j, "test");
  const KvPlan plan = testing::plan_for_requests(c, testing::small_plan_settings(64, 16, KvDtype::fp8_e4m3, 16), 3);
  ASSERT_GE(plan.groups.size(), 2u);
  auto be = make_backend(BackendChoice::cpu, c, {});
  be->allocate_kv(plan, kv_layout(plan));
  const KvLayerMap map = kv_layer_map(plan, c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const KvLayerStorage st = be->kv_layer(l);
    EXPECT_EQ(st.layout.num_blocks, plan.num_blocks);
    EXPECT_NE(st.k_cache, st.v_cache);
    EXPECT_EQ(be->kv_group_of_layer(l), map.group[l]);
    for (int m = 0; m < c.num_layers; ++m)
      EXPECT_EQ(be->kv_layer(m).k_cache == st.k_cache, map.slot[m] == map.slot[l]) << l << " " << m;
  }
  EXPECT_EQ(static_cast<uint64_t>(plan.group_size) * 2 * kv_layout(plan).cache_bytes(), plan.pool_bytes());
}

TEST(BackendFactory, NamesResolveAndCudaIsRefusedClearly) {
  const ModelConfig c = tiny_config("llama");
  EXPECT_EQ(make_backend(BackendChoice::cpu, c, {})->name(), "cpu");
  EXPECT_EQ(resolve_backend(BackendChoice::cpu), BackendKind::cpu);
  EXPECT_EQ(resolve_backend(BackendChoice::cuda), BackendKind::cuda);  // resolving checks nothing; require does
  if (!cuda_device_available()) {
    EXPECT_EQ(resolve_backend(BackendChoice::auto_), BackendKind::cpu);
    EXPECT_EQ(make_backend(BackendChoice::auto_, c, {})->name(), "cpu");
    EXPECT_THROW(require_backend(BackendChoice::cuda), InputError);
    try {
      make_backend(BackendChoice::cuda, c, {});
      ADD_FAILURE() << "cuda without a CUDA backend must throw";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--backend cuda"), std::string::npos) << e.what();
    }
  }
  // An unknown --backend name is the CLI's refusal now (cli/engine_flags.h;
  // tests/e2e/engine_flags.sh): BackendChoice cannot hold one.
}

void write_config(const std::filesystem::path& dir, const std::string& family) {
  std::ofstream(dir / "config.json") << tiny_config_json(family).dump();
}

// Dummy weights: deterministic, N(0, 0.02) matrices, norms exactly 1, and
// a whole engine runs from config.json alone (no safetensors).
TEST(DummyLoad, RunsFromConfigAloneAndIsDeterministic) {
  test_util::TempDir dir;
  write_config(dir.path(), "gemma3");
  EngineOptions o;
  o.max_model_len = 64;
  o.kv_memory_bytes = 8u << 20;
  EXPECT_THROW(Engine::load(dir.path(), o), InputError);  // auto: needs the safetensors
  o.load_format = LoadFormat::dummy;
  auto a = Engine::load(dir.path(), o);
  auto b = Engine::load(dir.path(), o);
  GenerateOptions g;
  g.max_tokens = 8;
  g.stop_at_eos = false;
  const std::vector<int> prompt = {5, 9, 13, 17};
  const GenerateResult ra = a->generate(prompt, g), rb = b->generate(prompt, g);
  EXPECT_EQ(ra.tokens.size(), 8u);
  EXPECT_EQ(ra.tokens, rb.tokens);
  const ScoreResult sa = a->score(prompt);
  for (size_t i = 1; i < prompt.size(); ++i) EXPECT_TRUE(std::isfinite(*sa.logprobs[i]));
  // An unknown --load-format is the CLI's refusal (cli/engine_flags.h;
  // tests/e2e/engine_flags.sh): LoadFormat cannot hold one.
}

TEST(DummyLoad, WeightStatistics) {
  const ModelConfig c = tiny_config("qwen3");
  auto w = dummy_weights(c, 7);
  auto w2 = dummy_weights(c, 7);
  const auto& m = w->layers[0].gate_proj;
  ASSERT_TRUE(m.bf16);
  const auto* p = static_cast<const uint16_t*>(m.data);
  const auto* p2 = static_cast<const uint16_t*>(w2->layers[0].gate_proj.data);
  const int64_t n = m.rows * m.cols;
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = bf16_to_f32(p[i]);
    sum += x;
    sq += x * x;
    ASSERT_EQ(p[i], p2[i]);
  }
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  // n = 6144 samples: the sample sd is within a few % of 0.02, the mean within 5 sigma / sqrt(n).
  EXPECT_NEAR(sd, 0.02, 0.02 * 0.05);
  EXPECT_NEAR(mean, 0.0, 5 * 0.02 / std::sqrt(static_cast<double>(n)));
  for (float v : w->layers[0].input_norm) EXPECT_EQ(v, 1.0f);
  for (float v : w->layers[0].q_norm) EXPECT_EQ(v, 1.0f);
  for (float v : w->final_norm) EXPECT_EQ(v, 1.0f);
  auto other = dummy_weights(c, 8);
  EXPECT_NE(static_cast<const uint16_t*>(other->layers[0].gate_proj.data)[0], p[0]);
}

}  // namespace
}  // namespace fp8kv
