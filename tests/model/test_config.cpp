// ModelConfig parsing against configs shaped like the real Hub ones, with the
// expected values written from transformers' own rules (see config.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "../common/errors.h"
#include "io/errors.h"
#include "model/config.h"

using namespace fp8kv;
using ::testing::HasSubstr;
using nlohmann::json;

namespace {

ModelConfig parse(const json& j) { return parse_model_config(j, "config.json"); }

std::string error_of(const json& j) {
  try {
    parse(j);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

std::vector<LayerType> types(const std::string& pattern) {  // "FFS" -> full, full, sliding
  std::vector<LayerType> t;
  for (char c : pattern) t.push_back(c == 'S' ? LayerType::sliding_attention : LayerType::full_attention);
  return t;
}

json llama31_8b() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": false,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16"})");
}

}  // namespace

TEST(Config, Llama31) {
  const ModelConfig c = parse(llama31_8b());
  EXPECT_EQ(c.family, ModelFamily::llama);
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // 4096 / 32
  EXPECT_EQ(c.layer_types, std::vector<LayerType>(32, LayerType::full_attention));
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.rope_full.type, "llama3");
  EXPECT_EQ(c.rope_full.theta, 500000.0);
  EXPECT_EQ(c.rope_full.factor, 8.0);
  EXPECT_EQ(c.rope_full.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qk_norm || c.attention_bias || c.o_proj_bias || c.mlp_bias);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / std::sqrt(128.0f));
}

TEST(Config, LlamaDefaultsAndLegacyRopeTypeKey) {
  json j = json::parse(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
    "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100,
    "rope_scaling": {"type": "linear", "factor": 2.0}})");
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");  // absent architectures: the family's causal LM
  EXPECT_EQ(c.num_kv_heads, 4);                   // defaults to num_attention_heads
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope_full.type, "linear");
  EXPECT_EQ(c.rope_full.factor, 2.0);
  EXPECT_EQ(c.rope_full.theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 2048);  // LlamaConfig default
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{2}));
  EXPECT_EQ(c.bos_token_id, 1);
  // Newer rope_parameters form gives the same result.
  json k = j;
  k.erase("rope_scaling");
  k["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 10000.0}};
  const ModelConfig c2 = parse(k);
  EXPECT_EQ(c2.rope_full.type, "linear");
  EXPECT_EQ(c2.rope_full.factor, 2.0);
  EXPECT_EQ(c2.rope_sliding.type, "linear");
  // llama attention_bias / mlp_bias.
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  const ModelConfig c3 = parse(j);
  EXPECT_TRUE(c3.attention_bias && c3.o_proj_bias && c3.mlp_bias);
}

TEST(Config, MistralSlidingWindow) {
  json j = json::parse(R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 4, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 32000, "sliding_window": 4096, "rope_theta": 10000.0})");
  ModelConfig c = parse(j);
  EXPECT_EQ(c.family, ModelFamily::mistral);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.layer_types, types("SSSS"));
  EXPECT_EQ(c.window_for_layer(3), 4096);
  j["sliding_window"] = nullptr;  // Mistral-7B-v0.2+: no window
  c = parse(j);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.layer_types, types("FFFF"));
  j.erase("sliding_window");  // MistralConfig default: 4096
  c = parse(j);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_FALSE(c.attention_bias);
}

TEST(Config, Qwen2SlidesOnlyWithUseSlidingWindow) {
  json j = json::parse(R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 6, "num_attention_heads": 14,
    "num_key_value_heads": 2, "vocab_size": 151936, "max_window_layers": 4, "sliding_window": 32768,
    "use_sliding_window": false, "rope_theta": 1000000.0, "tie_word_embeddings": true,
    "eos_token_id": 151643, "bos_token_id": 151643})");
  ModelConfig c = parse(j);
  EXPECT_EQ(c.family, ModelFamily::qwen2);
  EXPECT_TRUE(c.attention_bias);  // Qwen2 q/k/v always have bias
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.layer_types, types("FFFFFF"));
  // use_sliding_window: layers >= max_window_layers slide.
  j["use_sliding_window"] = true;
  c = parse(j);
  EXPECT_EQ(c.sliding_window, 32768);
  EXPECT_EQ(c.layer_types, types("FFFFSS"));
  // Explicit layer_types win over max_window_layers when sliding is on...
  j["layer_types"] = {"sliding_attention", "full_attention", "full_attention", "full_attention", "full_attention",
                      "sliding_attention"};
  c = parse(j);
  EXPECT_EQ(c.layer_types, types("SFFFFS"));
  // ...and are ignored when it is off (sliding_window becomes None).
  j["use_sliding_window"] = false;
  c = parse(j);
  EXPECT_EQ(c.layer_types, types("FFFFFF"));
  EXPECT_FALSE(c.sliding_window.has_value());
  // No sliding layer at all: no window reported.
  j.erase("layer_types");
  j["use_sliding_window"] = true;
  j["max_window_layers"] = 6;
  c = parse(j);
  EXPECT_EQ(c.layer_types, types("FFFFFF"));
  EXPECT_FALSE(c.sliding_window.has_value());
}

TEST(Config, Qwen3) {
  json j = json::parse(R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 3, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_window_layers": 28,
    "sliding_window": null, "use_sliding_window": false, "rope_theta": 1000000, "rope_scaling": null,
    "attention_bias": false, "tie_word_embeddings": true, "eos_token_id": 151645,
    "layer_types": ["full_attention", "sliding_attention", "full_attention"]})");
  ModelConfig c = parse(j);
  EXPECT_EQ(c.family, ModelFamily::qwen3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.head_dim, 128);  // explicit, != hidden / heads
  EXPECT_EQ(c.rope_full.theta, 1e6);
  EXPECT_EQ(c.layer_types, types("FFF"));  // use_sliding_window false wins
  EXPECT_FALSE(c.bos_token_id.has_value());
  j.erase("head_dim");
  EXPECT_EQ(parse(j).head_dim, 128);  // Qwen3Config default head_dim
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  c = parse(j);
  EXPECT_EQ(c.layer_types, types("FSF"));
  EXPECT_EQ(c.num_sliding_layers(), 1);
  // Yarn rope (Qwen3 long context).
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  c = parse(j);
  EXPECT_EQ(c.rope_full.type, "yarn");
  EXPECT_EQ(c.rope_full.factor, 4.0);
  EXPECT_EQ(c.rope_full.original_max_position_embeddings, 32768);
  EXPECT_EQ(c.rope_full.beta_fast, 32.0);
  EXPECT_EQ(c.rope_full.beta_slow, 1.0);
  EXPECT_FALSE(c.rope_full.attention_factor.has_value());
}

TEST(Config, Gemma3TextLegacy) {
  // Shaped like google/gemma-3-1b-it.
  json j = json::parse(R"({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 8, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144, "sliding_window": 512,
    "sliding_window_pattern": 6, "rope_local_base_freq": 10000, "rope_theta": 1000000,
    "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh", "rope_scaling": null,
    "final_logit_softcapping": null, "attn_logit_softcapping": null, "eos_token_id": [1, 106],
    "bos_token_id": 2})");
  ModelConfig c = parse(j);
  EXPECT_EQ(c.family, ModelFamily::gemma3);
  EXPECT_EQ(c.layer_types, types("SSSSSFSS"));  // every 6th layer full
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.rope_full.theta, 1e6);
  EXPECT_EQ(c.rope_sliding.theta, 10000.0);
  EXPECT_EQ(c.rope_for_layer(5).theta, 1e6);
  EXPECT_EQ(c.rope_for_layer(0).theta, 10000.0);
  EXPECT_EQ(c.hidden_act, "gelu_pytorch_tanh");
  EXPECT_TRUE(c.tie_word_embeddings);  // Gemma3 default
  EXPECT_TRUE(c.qk_norm && c.gemma_norm_plus_one && c.embed_scale_sqrt_hidden && c.sandwich_norms);
  EXPECT_FALSE(c.attn_logit_softcapping.has_value());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{1, 106}));
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / 16.0f);  // 1/sqrt(256)
  j["query_pre_attn_scalar"] = 144;
  j["final_logit_softcapping"] = 30.0;
  c = parse(j);
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / 12.0f);
  EXPECT_EQ(c.final_logit_softcapping, 30.0);
  // A null window: sliding-typed layers attend like full ones (transformers).
  json nw = j;
  nw["sliding_window"] = nullptr;
  EXPECT_EQ(parse(nw).layer_types, types("FFFFFFFF"));
  EXPECT_FALSE(parse(nw).sliding_window.has_value());
  // Linear scaling applies to the global (full) layers only.
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  c = parse(j);
  EXPECT_EQ(c.rope_full.type, "linear");
  EXPECT_EQ(c.rope_sliding.type, "default");
  EXPECT_EQ(c.rope_sliding.factor, 1.0);
}

TEST(Config, Gemma3RopeParametersPerLayerType) {
  json j = json::parse(R"({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 100, "sliding_window": 16,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}})");
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.layer_types, types("SFS"));
  EXPECT_EQ(c.rope_full.type, "linear");
  EXPECT_EQ(c.rope_full.theta, 1e6);
  EXPECT_EQ(c.rope_sliding.type, "default");
  EXPECT_EQ(c.rope_sliding.theta, 10000.0);
}

TEST(Config, Gemma3MultimodalTextConfigWithOmittedDefaults) {
  // Shaped like google/gemma-3-4b-it: text_config omits values equal to defaults.
  json j = json::parse(R"({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "eos_token_id": [1, 106], "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
    "model_type": "gemma3_text", "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "sliding_window": 1024}, "vision_config": {"model_type": "siglip_vision_model"}, "torch_dtype": "bfloat16"})");
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.architecture, "Gemma3ForConditionalGeneration");
  EXPECT_EQ(c.model_type, "gemma3");
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_EQ(c.num_layers, 34);
  EXPECT_EQ(c.num_sliding_layers(), 34 - 5);  // layers 5, 11, 17, 23, 29 are full
  EXPECT_EQ(c.rope_full.factor, 8.0);
  EXPECT_EQ(c.rope_sliding.factor, 1.0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{1, 106}));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  const std::string err = error_of(json::parse(R"({"model_type": "gemma3", "text_config": {"head_dim": "x"}})"));
  EXPECT_NE(err.find("text_config.head_dim"), std::string::npos) << err;
}

TEST(Config, ErrorsNameTheField) {
  auto has = [](const std::string& err, const std::string& what) {
    return err.find(what) != std::string::npos;
  };
  json j = llama31_8b();
  j["model_type"] = "gpt2";
  std::string err = error_of(j);
  EXPECT_TRUE(has(err, "gpt2") && has(err, "LlamaForCausalLM") && has(err, "Qwen3ForCausalLM")) << err;
  j = llama31_8b();
  j["architectures"] = {"LlamaForSequenceClassification"};
  EXPECT_TRUE(has(error_of(j), "LlamaForSequenceClassification")) << error_of(j);
  j = llama31_8b();
  j.erase("model_type");
  EXPECT_TRUE(has(error_of(j), "'model_type'"));
  j = llama31_8b();
  j["hidden_size"] = "4096";
  err = error_of(j);
  EXPECT_TRUE(has(err, "config.json") && has(err, "'hidden_size'") && has(err, "integer")) << err;
  j = llama31_8b();
  j["num_key_value_heads"] = 5;
  EXPECT_TRUE(has(error_of(j), "num_key_value_heads"));
  j = llama31_8b();
  j["num_hidden_layers"] = 0;
  EXPECT_TRUE(has(error_of(j), "num_hidden_layers"));
  j = llama31_8b();
  j["rope_scaling"]["rope_type"] = "longrope";
  EXPECT_TRUE(has(error_of(j), "longrope"));
  j = llama31_8b();
  j["rope_scaling"].erase("original_max_position_embeddings");
  EXPECT_TRUE(has(error_of(j), "original_max_position_embeddings"));
  j = llama31_8b();
  j["eos_token_id"] = "x";
  EXPECT_TRUE(has(error_of(j), "eos_token_id"));
  j = llama31_8b();
  j["hidden_act"] = "relu2";
  EXPECT_TRUE(has(error_of(j), "relu2"));
  json q = json::parse(R"({"model_type": "qwen3", "num_hidden_layers": 2, "use_sliding_window": true,
    "layer_types": ["full_attention"]})");
  EXPECT_TRUE(has(error_of(q), "layer_types")) << error_of(q);
  q["layer_types"] = {"full_attention", "chunked_attention"};
  EXPECT_TRUE(has(error_of(q), "chunked_attention"));
  EXPECT_TRUE(has(error_of(json::array()), "JSON object"));
  j = llama31_8b();
  j["max_position_embeddings"] = 4096.0;  // integral floats are accepted, as Python does
  EXPECT_EQ(parse(j).max_position_embeddings, 4096);
}

TEST(Config, HugeIntegersStateTheBound) {
  // Issue 15 item 14: the error says what the upper bound is.
  const std::string bound = "expected a positive integer <= 2147483647 (2^31 - 1)";
  for (const char* f : {"num_hidden_layers", "hidden_size", "max_position_embeddings", "vocab_size"}) {
    json j = llama31_8b();
    j[f] = 1000000000000LL;  // 1e12
    const std::string err = error_of(j);
    EXPECT_NE(err.find(std::string("field '") + f + "'"), std::string::npos) << err;
    EXPECT_NE(err.find(bound + ", got 1000000000000"), std::string::npos) << err;
  }
  json j = llama31_8b();
  j["hidden_size"] = 1LL << 62;
  EXPECT_NE(error_of(j).find(bound + ", got 4611686018427387904"), std::string::npos) << error_of(j);
  j = json::parse(R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 100, "max_position_embeddings": 256})");
  j["sliding_window"] = std::numeric_limits<int64_t>::max();
  EXPECT_NE(error_of(j).find("'sliding_window': " + bound), std::string::npos) << error_of(j);
  j = llama31_8b();
  j["num_hidden_layers"] = 1e20;  // a float too large to be an exact integer
  EXPECT_NE(error_of(j).find("expected an integer (at most 2^53"), std::string::npos) << error_of(j);
  j = llama31_8b();
  j["eos_token_id"] = {128001, 1LL << 40};
  EXPECT_NE(error_of(j).find("'eos_token_id': expected a token id (an integer in [0, 2147483647])"), std::string::npos)
      << error_of(j);
}

TEST(Config, RopeFactorThatShrinksTheContextToNothingIsNamed) {
  // Issue 15 item 13: factor 1e-300 used to surface as "model config has no
  // max_position_embeddings" in the planner.
  json j = llama31_8b();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 1e-300}};
  std::string err = error_of(j);
  EXPECT_NE(err.find("config.json: field 'rope_scaling.factor': 1e-300 scales the context of 131072 positions"),
            std::string::npos)
      << err;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 1e-4}, {"original_max_position_embeddings", 4096}};
  err = error_of(j);
  EXPECT_NE(err.find("'rope_scaling.factor'"), std::string::npos) << err;
  EXPECT_NE(err.find("4096 positions"), std::string::npos) << err;
  // A factor below 1 that still leaves tokens is accepted, as transformers does.
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 0.5}};
  EXPECT_EQ(parse(j).rope_full.factor, 0.5);
}

TEST(Config, LoadFromDirWithGenerationConfig) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fp8kv_cfg_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << llama31_8b().dump();
  EXPECT_EQ(load_model_config(dir).eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
  EXPECT_EQ(load_model_config(dir / "config.json").num_layers, 32);
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 128009})";
  EXPECT_EQ(load_model_config(dir).eos_token_ids, (std::vector<int>{128009}));
  std::ofstream(dir / "config.json") << "{ not json";
  EXPECT_THAT(test_util::input_error_of([&] { load_model_config(dir); }), HasSubstr("config.json"));
  fs::remove_all(dir);
  EXPECT_THROW(load_model_config(dir), InputError);
}
