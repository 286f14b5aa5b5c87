// A tiny llama checkpoint on disk for calibration / inject tests: random fp32
// weights for every tensor weights_spec expects, with an optional planted V
// outlier (one output row of one layer's v_proj scaled up, so that layer's V
// exceeds the e4m3 range at unity scale).
#pragma once
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/random_weights.h"
#include "io/fs_util.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights_spec.h"

namespace fp8kv::testing {

inline nlohmann::json tiny_llama_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 64},
          {"intermediate_size", 96},
          {"num_hidden_layers", 3},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"vocab_size", 97},
          {"max_position_embeddings", 256},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"tie_word_embeddings", false},
          {"eos_token_id", 2},
          {"bos_token_id", 1},
          {"torch_dtype", "float32"}};
}

// n random token sequences of len ids below the tiny vocabulary (97).
inline std::vector<std::vector<int>> random_token_seqs(int n, int len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int>> c(static_cast<size_t>(n));
  for (auto& s : c)
    for (int i = 0; i < len; ++i) s.push_back(static_cast<int>(rng() % 97));
  return c;
}

struct TinyCheckpointOptions {
  int outlier_layer = -1;     // layer whose v_proj gets a planted outlier row
  float outlier_gain = 0.0f;  // that row is multiplied by this
  bool outlier_all_rows = false;  // scale every row of that v_proj (all of the layer's V leaves the e4m3 range)
  bool sharded = false;       // two shards + index instead of model.safetensors
  uint64_t seed = 1;
};

inline void write_tiny_checkpoint(const std::filesystem::path& dir, const TinyCheckpointOptions& o = {}) {
  std::filesystem::create_directories(dir);
  const auto cfg_json = tiny_llama_config();
  atomic_write_file(dir / "config.json", cfg_json.dump(2));
  const ModelConfig cfg = parse_model_config(cfg_json, "tiny config");
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> nd(0.0f, 0.08f);
  std::vector<TensorToWrite> a, b;
  int i = 0;
  for (const auto& spec : expected_tensors(cfg)) {
    std::vector<float> v = test_util::random_weight_values(spec.shape, rng, nd);
    if (o.outlier_layer >= 0 &&
        spec.name == "model.layers." + std::to_string(o.outlier_layer) + ".self_attn.v_proj.weight") {
      const int64_t rows = spec.shape[0], cols = spec.shape[1];
      for (int64_t row = 0; row < rows; ++row)
        if (o.outlier_all_rows || row == 5)  // row 5: KV head 0, channel 5
          for (int64_t c = 0; c < cols; ++c) v[static_cast<size_t>(row * cols + c)] *= o.outlier_gain;
    }
    auto t = make_f32_tensor(spec.name, spec.shape, v);
    (o.sharded && (i++ % 2) ? b : a).push_back(std::move(t));
  }
  if (!o.sharded) {
    write_safetensors(dir / "model.safetensors", a);
    return;
  }
  write_safetensors(dir / "model-00001-of-00002.safetensors", a);
  write_safetensors(dir / "model-00002-of-00002.safetensors", b);
  nlohmann::json idx;
  idx["metadata"] = {{"total_size", 0}};
  for (const auto& t : a) idx["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : b) idx["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  atomic_write_file(dir / "model.safetensors.index.json", idx.dump(2));
}

// The tiny Qwen3.5 golden checkpoint tests/golden/models_qwen3_5/l3f1_hd64
// (layers 0-2 linear_attention, layer 3 full_attention; Qwen3_5ForCausalLM,
// `model.*`) copied to `dir`. conditional_generation: rewritten in the
// Qwen3_5ForConditionalGeneration layout (model_type qwen3_5, the text config
// under text_config, tensors `model.language_model.*`, lm_head.weight as is).
inline std::filesystem::path qwen3_5_golden_dir() {
  return std::filesystem::path(FP8KV_SOURCE_DIR) / "tests/golden/models_qwen3_5/l3f1_hd64";
}
inline void write_qwen3_5_checkpoint(const std::filesystem::path& dir, bool conditional_generation) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(qwen3_5_golden_dir() / f, dir / f, fs::copy_options::overwrite_existing);
  if (!conditional_generation) return;
  std::ifstream in(qwen3_5_golden_dir() / "config.json");
  nlohmann::json text = nlohmann::json::parse(in);
  text.erase("architectures");
  nlohmann::json top = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
                        {"model_type", "qwen3_5"},
                        {"tie_word_embeddings", text["tie_word_embeddings"]},
                        {"text_config", text}};
  atomic_write_file(dir / "config.json", top.dump(2));
  const auto src = SafetensorsFile::open(qwen3_5_golden_dir() / "model.safetensors");
  std::vector<TensorToWrite> out;
  for (const auto& t : src->tensors()) {
    const TensorView v = src->view(t.name);
    std::string name = t.name;
    if (name.rfind("model.", 0) == 0) name = "model.language_model." + name.substr(6);
    out.push_back({name, t.dtype, t.shape, std::vector<std::byte>(v.data, v.data + v.nbytes())});
  }
  write_safetensors(dir / "model.safetensors", out, {{"format", "pt"}});
}

}  // namespace fp8kv::testing
