// Tiny FP8-weight checkpoints written by the tests themselves, in each
// loadable format (model/quant_config.h), and their f32 "twins": the same
// checkpoint with every quantized matrix written as its dequantized values
// e4m3(q) * scale in F32 and no quantization config. Loading the twin runs
// the existing f32 path on exactly the weights the fp8 path computes with.
#pragma once
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/random_weights.h"
#include "io/fs_util.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights_spec.h"
#include "numerics/fp8.h"
#include "numerics/fp8_weights.h"
#include "reference.h"

namespace fp8kv::testing {

enum class Fp8Format { block, ct_channel, ct_tensor, modelopt };

inline const char* fp8_format_name(Fp8Format f) {
  switch (f) {
    case Fp8Format::block: return "block";
    case Fp8Format::ct_channel: return "ct_channel";
    case Fp8Format::ct_tensor: return "ct_tensor";
    case Fp8Format::modelopt: return "modelopt";
  }
  return "?";
}

// Sizes with partial 128-blocks: K = 160 (blocks 128 + 32), N = 288, 160, 80.
// qwen3_5: a Gated DeltaNet layer, then a full-attention one; in_proj_qkv
// N = 320 (2 x 2 x 32 + 4 x 48), in_proj_z 192, in_proj_a / in_proj_b 4 (one
// partial block), out_proj K = 192.
inline nlohmann::json fp8_test_config(const std::string& family) {
  nlohmann::json j = tiny_config_json(family);
  j["hidden_size"] = 160;
  j["intermediate_size"] = 288;
  j["head_dim"] = 40;
  j["num_hidden_layers"] = 2;
  if (family == "qwen3_5") {
    j["layer_types"] = {"linear_attention", "full_attention"};
    j["linear_key_head_dim"] = 32;
    j["linear_value_head_dim"] = 48;
  } else if (j.contains("layer_types")) {
    j["layer_types"] = {"full_attention", "sliding_attention"};
  }
  return j;
}

// The quantization config of each format (config.json's quantization_config,
// or hf_quant_config.json for modelopt), with one excluded projection each.
inline nlohmann::json fp8_quant_json(Fp8Format f) {
  using nlohmann::json;
  switch (f) {
    case Fp8Format::block:
      return {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
              {"weight_block_size", {128, 128}}, {"modules_to_not_convert", {"lm_head", "layers.1.mlp.down_proj"}}};
    case Fp8Format::ct_channel:
    case Fp8Format::ct_tensor: {
      const bool ch = f == Fp8Format::ct_channel;
      json w = {{"num_bits", 8}, {"type", "float"}, {"strategy", ch ? "channel" : "tensor"}, {"symmetric", true},
                {"dynamic", false}};
      json a = ch ? json{{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}}
                  : json{{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", false}};
      return {{"quant_method", "compressed-tensors"}, {"format", "float-quantized"},
              {"quantization_status", "compressed"},
              {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", w}, {"input_activations", a}}}}},
              // ct_tensor: lm_head is quantized too (not ignored).
              {"ignore", ch ? json{"lm_head", "re:.*layers\\.0\\.self_attn\\.o_proj$"} : json::array()}};
    }
    case Fp8Format::modelopt:
      return {{"producer", {{"name", "modelopt"}, {"version", "0.29.0"}}},
              {"quantization", {{"quant_algo", "FP8"}, {"kv_cache_quant_algo", nullptr},
                                {"exclude_modules", {"lm_head", "model.layers.1.self_attn.*"}}}}};
  }
  return {};
}

inline bool fp8_quantizes(Fp8Format f, const std::string& module) {
  if (module == "lm_head") return f == Fp8Format::ct_tensor;
  if (module.find("embed_tokens") != std::string::npos) return false;
  switch (f) {
    case Fp8Format::block: return module.find("layers.1.mlp.down_proj") == std::string::npos;
    case Fp8Format::ct_channel: return module != "model.layers.0.self_attn.o_proj";
    case Fp8Format::ct_tensor: return true;
    case Fp8Format::modelopt: return module.rfind("model.layers.1.self_attn.", 0) != 0;
  }
  return false;
}

inline ScaleGranularity fp8_granularity(Fp8Format f) {
  return f == Fp8Format::block ? ScaleGranularity::block128
         : f == Fp8Format::ct_channel ? ScaleGranularity::channel
                                      : ScaleGranularity::tensor;
}

inline TensorToWrite raw_tensor(std::string name, DType dt, std::vector<int64_t> shape, const void* p, size_t bytes) {
  TensorToWrite t{std::move(name), dt, std::move(shape), std::vector<std::byte>(bytes)};
  std::memcpy(t.data.data(), p, bytes);
  return t;
}

struct Fp8CheckpointOptions {
  std::string family = "llama";
  Fp8Format format = Fp8Format::block;
  bool twin = false;  // write the f32 twin instead
  uint64_t seed = 7;
  // Modules (substrings of the name) kept bf16 and listed in the block
  // format's modules_to_not_convert, beside its own exclusions.
  std::vector<std::string> keep_bf16;
  // Edits config.json before the tensors are made (their shapes follow it),
  // e.g. a shape whose tensor-parallel shards are whole 128-row blocks.
  std::function<void(nlohmann::json& config)> edit_config;
  // Edits the tensors / config.json / the quantization json before writing (refusal tests).
  std::function<void(std::vector<TensorToWrite>&, nlohmann::json& config, nlohmann::json& quant)> mutate;
};

inline void write_fp8_checkpoint(const std::filesystem::path& dir, const Fp8CheckpointOptions& o) {
  std::filesystem::create_directories(dir);
  nlohmann::json cfg_json = fp8_test_config(o.family);
  if (o.edit_config) o.edit_config(cfg_json);
  nlohmann::json quant = fp8_quant_json(o.format);
  if (!o.keep_bf16.empty()) {
    if (o.format != Fp8Format::block) throw std::logic_error("write_fp8_checkpoint: keep_bf16 is for the block format");
    for (const auto& m : o.keep_bf16) quant["modules_to_not_convert"].push_back(m);
  }
  auto kept = [&](const std::string& module) {
    for (const auto& m : o.keep_bf16)
      if (module.find(m) != std::string::npos) return true;
    return false;
  };
  const ModelConfig cfg = parse_model_config(cfg_json, "fp8 test config");
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> nd(0.0f, 0.08f);
  std::vector<TensorToWrite> ts;
  const ScaleGranularity g = fp8_granularity(o.format);
  for (const auto& spec : expected_tensors(cfg)) {
    std::vector<float> v = test_util::random_weight_values(spec.shape, rng, nd);
    const bool vec = spec.shape.size() != 2;  // norms, Gated DeltaNet vectors, the 3-D conv1d
    const std::string module = spec.name.substr(0, spec.name.size() - 7);  // minus ".weight"
    if (vec || !fp8_quantizes(o.format, module) || kept(module)) {
      ts.push_back(make_f32_tensor(spec.name, spec.shape, v));
      continue;
    }
    const int64_t N = spec.shape[0], K = spec.shape[1];
    Fp8QuantizedWeight q = quantize_weight_e4m3(v.data(), N, K, g);
    // compressed-tensors channel scales as BF16 (as some releases ship them):
    // the stored (rounded) scale is the real one.
    const bool bf16_scales = o.format == Fp8Format::ct_channel;
    if (bf16_scales)
      for (auto& s : q.scales) s = round_bf16(s);
    if (o.twin) {
      const auto [sr, sc] = fp8_scale_shape(g, N, K);
      (void)sr;
      for (int64_t r = 0; r < N; ++r)
        for (int64_t c = 0; c < K; ++c) {
          const float s = g == ScaleGranularity::tensor    ? q.scales[0]
                          : g == ScaleGranularity::channel ? q.scales[r]
                                                           : q.scales[(r / 128) * sc + c / 128];
          v[r * K + c] = e4m3_to_f32(q.q[r * K + c]) * s;
        }
      ts.push_back(make_f32_tensor(spec.name, spec.shape, v));
      continue;
    }
    ts.push_back(raw_tensor(spec.name, DType::F8_E4M3, spec.shape, q.q.data(), q.q.size()));
    const auto [sr, sc] = fp8_scale_shape(g, N, K);
    switch (o.format) {
      case Fp8Format::block:
        ts.push_back(make_f32_tensor(module + ".weight_scale_inv", {sr, sc}, q.scales));
        break;
      case Fp8Format::ct_channel: {
        std::vector<uint16_t> b(q.scales.size());
        for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(q.scales[i]);
        ts.push_back(raw_tensor(module + ".weight_scale", DType::BF16, {N, 1}, b.data(), b.size() * 2));
        break;
      }
      case Fp8Format::ct_tensor: {
        ts.push_back(make_f32_tensor(module + ".weight_scale", {1}, q.scales));
        const float in = 0.05f;
        ts.push_back(make_f32_tensor(module + ".input_scale", {1}, std::vector<float>{in}));
        break;
      }
      case Fp8Format::modelopt: {
        ts.push_back(make_f32_tensor(module + ".weight_scale", {}, q.scales));
        ts.push_back(make_f32_tensor(module + ".input_scale", {}, std::vector<float>{0.05f}));
        break;
      }
    }
  }
  if (o.mutate) o.mutate(ts, cfg_json, quant);
  if (!o.twin && o.format != Fp8Format::modelopt) cfg_json["quantization_config"] = quant;
  atomic_write_file(dir / "config.json", cfg_json.dump(2));
  if (!o.twin && o.format == Fp8Format::modelopt) atomic_write_file(dir / "hf_quant_config.json", quant.dump(2));
  write_safetensors(dir / "model.safetensors", ts);
}

// The tensor named `name` in ts (throws when absent).
// A CPU engine over an fp8-weight checkpoint: bf16 cache, 64 tokens.
inline EngineOptions fp8_engine_options(Fp8Compute mode = Fp8Compute::w8a16, int tp = 1) {
  EngineOptions o;
  o.backend = BackendChoice::cpu;
  o.kv_cache_dtype = "bf16";
  o.max_model_len = 64;
  o.kv_memory_bytes = 8u << 20;
  o.fp8_weight_mode = mode;
  o.tensor_parallel_size = tp;
  return o;
}

inline TensorToWrite& find_tensor(std::vector<TensorToWrite>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("test checkpoint has no tensor " + name);
}

}  // namespace fp8kv::testing
