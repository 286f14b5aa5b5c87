// Qwen3.5 config parsing: the fields and defaults of transformers'
// Qwen3_5TextConfig (models/qwen3_5/configuration_qwen3_5.py), the
// conditional-generation layout (text_config), and the MoE refusal.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/errors.h"
#include "model/config.h"

using namespace fp8kv;
using nlohmann::json;

namespace {

json tiny_text() {
  return json::parse(R"({
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "vocab_size": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 24, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": true}
  })");
}

std::string config_error_of(const json& j) {
  try {
    parse_model_config(j, "config.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ConfigQwen3_5, TextModelFields) {
  const ModelConfig c = parse_model_config(tiny_text(), "config.json");
  EXPECT_EQ(c.family, ModelFamily::qwen3_5);
  EXPECT_EQ(c.architecture, "Qwen3_5ForCausalLM");
  ASSERT_EQ(c.layer_types.size(), 4u);
  EXPECT_TRUE(c.is_linear(0) && c.is_linear(1) && c.is_linear(2) && !c.is_linear(3));
  EXPECT_EQ(c.num_attention_layers(), 1);
  ASSERT_TRUE(c.gdn.has_value());
  EXPECT_EQ(c.gdn->conv_kernel, 4);
  EXPECT_EQ(c.gdn->key_dim(), 32);
  EXPECT_EQ(c.gdn->value_dim(), 96);
  EXPECT_EQ(c.gdn->conv_dim(), 160);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.gemma_norm_plus_one);  // zero-centred norms: 1 + w
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_DOUBLE_EQ(c.rope_full.partial_rotary_factor, 0.25);
  EXPECT_DOUBLE_EQ(c.rope_full.theta, 1e7);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(ConfigQwen3_5, DefaultsFollowTransformers) {
  json j = tiny_text();
  for (const char* f : {"layer_types", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                        "linear_num_key_heads", "linear_num_value_heads", "rope_parameters"})
    j.erase(f);
  j["num_hidden_layers"] = 8;
  const ModelConfig c = parse_model_config(j, "config.json");
  // full_attention_interval 4: layers 3 and 7 are full attention.
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c.is_linear(i), i != 3 && i != 7) << i;
  EXPECT_EQ(c.gdn->conv_kernel, 4);
  EXPECT_EQ(c.gdn->num_k_heads, 16);
  EXPECT_EQ(c.gdn->num_v_heads, 32);
  EXPECT_EQ(c.gdn->k_head_dim, 128);
  EXPECT_EQ(c.gdn->v_head_dim, 128);
  EXPECT_DOUBLE_EQ(c.rope_full.partial_rotary_factor, 0.25);  // the BC default
  j["full_attention_interval"] = 2;
  j["partial_rotary_factor"] = 0.5;
  const ModelConfig c2 = parse_model_config(j, "config.json");
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c2.is_linear(i), i % 2 == 0) << i;
  EXPECT_DOUBLE_EQ(c2.rope_full.partial_rotary_factor, 0.5);
}

TEST(ConfigQwen3_5, ConditionalGenerationReadsTextConfig) {
  json text = tiny_text();
  text.erase("architectures");
  json j = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
            {"model_type", "qwen3_5"},
            {"text_config", text},
            {"vision_config", {{"depth", 2}, {"hidden_size", 32}}}};
  j["text_config"]["model_type"] = "qwen3_5_text";
  const ModelConfig c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.architecture, "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_attention_layers(), 1);
  EXPECT_EQ(c.gdn->value_dim(), 96);
}

TEST(ConfigQwen3_5, Refusals) {
  json moe = tiny_text();
  moe["model_type"] = "qwen3_5_moe";
  moe["architectures"] = {"Qwen3_5MoeForCausalLM"};
  EXPECT_NE(config_error_of(moe).find("'qwen3_5_moe' (the Qwen3.5 mixture-of-experts variant) is not supported"),
            std::string::npos)
      << config_error_of(moe);
  json bad = tiny_text();
  bad["linear_num_value_heads"] = 3;
  EXPECT_NE(config_error_of(bad).find("linear_num_value_heads"), std::string::npos);
  bad = tiny_text();
  bad["layer_types"][1] = "sliding_attention";
  EXPECT_NE(config_error_of(bad).find("entry 1 is \"sliding_attention\""), std::string::npos) << config_error_of(bad);
  bad = tiny_text();
  bad["layer_types"].erase(0);
  EXPECT_NE(config_error_of(bad).find("has 3 entries"), std::string::npos);
}
