// weights_spec: the tensor list per family (names, shapes, counts written by
// hand from the HF modeling code), naming detection, and check_weights.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "../common/errors.h"
#include "io/checkpoint.h"
#include "io/errors.h"
#include "model/config.h"
#include "model/weights_spec.h"

using namespace fp8kv;
using ::testing::AllOf;
using ::testing::HasSubstr;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

ModelConfig cfg_of(const std::string& s) { return parse_model_config(json::parse(s), "config.json"); }

std::map<std::string, std::vector<int64_t>> as_map(const std::vector<TensorSpec>& v) {
  std::map<std::string, std::vector<int64_t>> m;
  for (const auto& t : v) EXPECT_TRUE(m.emplace(t.name, t.shape).second) << "duplicate " << t.name;
  return m;
}

const char* kQwen2 = R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
  "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "vocab_size": 50, "tie_word_embeddings": true})";

}  // namespace

TEST(WeightsSpec, LlamaNamesAndShapes) {
  const auto c = cfg_of(R"({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 10})");
  const auto m = as_map(expected_tensors(c));
  EXPECT_EQ(m.size(), 1u + 2 * 9 + 1 + 1);  // embed, 9 per layer, norm, lm_head
  EXPECT_EQ(m.at("model.embed_tokens.weight"), (std::vector<int64_t>{10, 32}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.q_proj.weight"), (std::vector<int64_t>{64, 32}));  // 4 heads x 16
  EXPECT_EQ(m.at("model.layers.1.self_attn.k_proj.weight"), (std::vector<int64_t>{32, 32}));  // 2 heads x 16
  EXPECT_EQ(m.at("model.layers.0.self_attn.o_proj.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(m.at("model.layers.0.mlp.down_proj.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(m.at("model.layers.0.mlp.gate_proj.weight"), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(m.at("lm_head.weight"), (std::vector<int64_t>{10, 32}));
  EXPECT_EQ(m.count("model.layers.0.self_attn.q_norm.weight"), 0u);
  const auto names = expected_tensor_names(c);
  EXPECT_EQ(names.front(), "model.embed_tokens.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
}

TEST(WeightsSpec, Qwen2BiasesTied) {
  const auto m = as_map(expected_tensors(cfg_of(kQwen2)));
  EXPECT_EQ(m.size(), 1u + 2 * 12 + 1);  // 9 + q/k/v bias per layer; tied: no lm_head
  EXPECT_EQ(m.at("model.layers.0.self_attn.q_proj.bias"), (std::vector<int64_t>{64}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.v_proj.bias"), (std::vector<int64_t>{32}));
  EXPECT_EQ(m.count("model.layers.0.self_attn.o_proj.bias"), 0u);
  EXPECT_EQ(m.count("lm_head.weight"), 0u);
}

TEST(WeightsSpec, Qwen3AndGemma3Norms) {
  const auto q3 = as_map(expected_tensors(cfg_of(R"({"model_type": "qwen3", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "vocab_size": 50})")));
  EXPECT_EQ(q3.size(), 1u + 11 + 1 + 1);
  EXPECT_EQ(q3.at("model.layers.0.self_attn.q_norm.weight"), (std::vector<int64_t>{32}));
  EXPECT_EQ(q3.at("model.layers.0.self_attn.q_proj.weight"), (std::vector<int64_t>{128, 64}));

  const char* g = R"({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 32, "vocab_size": 50, "sliding_window": 8})";
  const auto g3 = as_map(expected_tensors(cfg_of(g)));
  EXPECT_EQ(g3.size(), 1u + 2 * 13 + 1);  // 9 + q/k norms + pre/post ffn norms; tied
  EXPECT_EQ(g3.at("model.layers.1.pre_feedforward_layernorm.weight"), (std::vector<int64_t>{64}));
  EXPECT_EQ(g3.at("model.layers.1.post_feedforward_layernorm.weight"), (std::vector<int64_t>{64}));
  EXPECT_EQ(g3.at("model.layers.1.self_attn.k_norm.weight"), (std::vector<int64_t>{32}));

  // Multimodal: transformers 5 names the text model model.language_model.*.
  const auto mm = cfg_of(R"({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 50}})");
  const auto names = expected_tensor_names(mm);
  EXPECT_EQ(names.front(), "model.language_model.embed_tokens.weight");
  EXPECT_TRUE(std::find(names.begin(), names.end(), "model.language_model.layers.0.mlp.up_proj.weight") != names.end());
}

TEST(WeightsSpec, KvScaleNames) {
  for (const char* n : {"model.layers.0.self_attn.k_scale", "model.layers.12.self_attn.v_scale",
                        "model.layers.3.self_attn.q_scale", "model.layers.3.self_attn.attn.k_scale",
                        "model.layers.3.self_attn.k_proj.output_scale", "model.layers.3.self_attn.k_proj.k_scale",
                        "model.layers.3.self_attn.v_proj.v_scale", "model.layers.3.self_attn.prob_output_scale",
                        "model.layers.3.self_attn.attn.prob_scale", "model.layers.3.self_attn.kv_scale",
                        "model.language_model.layers.3.self_attn.k_scale"})
    EXPECT_TRUE(is_kv_scale_tensor_name(n)) << n;
  for (const char* n : {"model.layers.0.self_attn.k_proj.weight", "k_scale", "model.norm.weight",
                        "model.layers.0.self_attn.k_proj.weight_scale"})
    EXPECT_FALSE(is_kv_scale_tensor_name(n)) << n;
}

TEST(WeightsSpec, CheckWeightsOnTinyLlama) {
  const fs::path src = fs::path(FP8KV_SOURCE_DIR) / "tests/data/tiny_llama";
  const auto cfg = load_model_config(src);
  const auto ckpt = Checkpoint::open(src);
  const auto naming = detect_weight_naming(cfg, *ckpt);
  EXPECT_EQ(naming.prefix, "model.");
  EXPECT_TRUE(check_weights(cfg, *ckpt, naming).empty());

  // Wrong intermediate size: the error names the file, tensor and both shapes.
  auto bad = cfg;
  bad.intermediate_size = 96;
  EXPECT_THAT(test_util::input_error_of([&] { check_weights(bad, *ckpt, naming); }),
              AllOf(HasSubstr("model.layers.0.mlp.gate_proj.weight"),
                    HasSubstr("[64, 32]"),
                    HasSubstr("[96, 32]"),
                    HasSubstr("model.safetensors")));
  // More layers than the checkpoint has: names the first missing tensor.
  bad = cfg;
  bad.num_layers = 3;
  bad.layer_types.push_back(LayerType::full_attention);
  EXPECT_THAT(test_util::input_error_of([&] { check_weights(bad, *ckpt, naming); }),
              HasSubstr("missing tensor model.layers.2.input_layernorm.weight"));
  // Tied: lm_head present but unused is neither required nor warned about.
  bad = cfg;
  bad.tie_word_embeddings = true;
  EXPECT_TRUE(check_weights(bad, *ckpt, naming).empty());
}

TEST(WeightsSpec, DetectsHubGemma3MultimodalPrefix) {
  const fs::path dir = fs::temp_directory_path() / ("fp8kv_ws_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto cfg = cfg_of(R"({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {"hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
    "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 3, "sliding_window": 2}})");
  // Write every tensor under the Hub's language_model.model.* names, plus a vision tensor.
  std::vector<TensorToWrite> ts;
  WeightNaming hub{"language_model.model.", "language_model.lm_head.weight"};
  for (const auto& s : expected_tensors(cfg, hub)) {
    int64_t n = 1;
    for (auto d : s.shape) n *= d;
    ts.push_back(make_f32_tensor(s.name, s.shape, std::vector<float>(static_cast<size_t>(n), 0.5f)));
  }
  ts.push_back(make_f32_tensor("vision_tower.w", {1}, std::vector<float>{1.f}));
  write_safetensors(dir / "model.safetensors", ts);
  const auto ckpt = Checkpoint::open(dir);
  const auto naming = detect_weight_naming(cfg, *ckpt);
  EXPECT_EQ(naming.prefix, "language_model.model.");
  EXPECT_EQ(check_weights(cfg, *ckpt, naming), (std::vector<std::string>{"vision_tower.w"}));
  // With the default (transformers 5) naming nothing is found.
  EXPECT_THROW(check_weights(cfg, *ckpt, default_weight_naming(cfg)), InputError);
  fs::remove_all(dir);
}
