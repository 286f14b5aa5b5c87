// Finite but absurd weights (issue 37): non-finite logits with every weight
// finite are bad input (InputError, exit 2), naming the first stage whose
// output overflowed, found by re-running the step with the forward pass
// checking each stage (ForwardPass::set_check_stages). CPU engine.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/engine.h"
#include "io/errors.h"
#include "reference.h"

namespace fp8kv {
namespace {

using ::testing::HasSubstr;
using testing::tiny_config;

EngineOptions small_options() {
  EngineOptions o;
  o.kv_cache_dtype = "bf16";
  o.block_size = 4;
  o.max_model_len = 64;
  o.kv_memory_bytes = 4u << 20;
  o.max_num_batched_tokens = 32;
  return o;
}

// The message of the InputError that generating from `w` throws ("" when none).
std::string failure(const ModelConfig& cfg, std::shared_ptr<ModelWeights> w) {
  auto e = Engine::create(cfg, w, small_options());
  GenerateOptions g;
  g.max_tokens = 3;
  const std::vector<int> prompt = {5, 9, 13, 17, 21};
  try {
    e->generate(prompt, g);
  } catch (const InputError& err) {
    return err.what();
  }
  return "";
}

class AbsurdWeights : public ::testing::TestWithParam<std::string> {};

TEST_P(AbsurdWeights, FirstOverflowingStageIsNamed) {
  const ModelConfig cfg = tiny_config(GetParam());
  ASSERT_GE(cfg.num_layers, 2);
  const auto fresh = [&] { return ModelWeights::random(cfg, 7, 0.15f, /*bf16=*/false); };
  {  // a layer's norm: that layer's output overflows
    auto w = fresh();
    for (int i = 0; i < 8; ++i) w->layers[1].post_attention_norm[static_cast<size_t>(i)] = 3.39e38f;
    const std::string m = failure(cfg, w);
    EXPECT_THAT(m, HasSubstr("every weight is finite, but layer 1's output overflowed float32"));
    EXPECT_THAT(m, HasSubstr("its largest weight: model.layers.1.post_attention_layernorm.weight holds 3.39e+38"));
  }
  {  // the final norm: every layer finite
    auto w = fresh();
    for (int i = 0; i < 8; ++i) w->final_norm[static_cast<size_t>(i)] = 3.39e38f;
    EXPECT_THAT(failure(cfg, w), HasSubstr("every layer's output is finite, but the final norm's output overflowed"));
  }
  {  // ordinary weights: no failure, and the check is off (the same tokens twice)
    auto w = fresh();
    EXPECT_EQ(failure(cfg, w), "");
  }
}

INSTANTIATE_TEST_SUITE_P(Families, AbsurdWeights, ::testing::Values("llama", "gemma3"));

}  // namespace
}  // namespace fp8kv
