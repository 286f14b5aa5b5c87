// The weight quantization a checkpoint declares (docs/design.md "FP8-weight
// checkpoints"): config.json's quantization_config, or ModelOpt's
// hf_quant_config.json. Three FP8 (e4m3) formats load; anything else that
// quantizes weights is refused (InputError naming the field and what is
// supported), never run with wrong numerics:
//   fp8                 quant_method "fp8" (Qwen3-FP8, DeepSeek-V3): weight_block_size
//                       [128, 128] -> weight_scale_inv [ceil(N/128)][ceil(K/128)];
//                       no block size -> weight_scale [1] (vLLM's per-tensor fp8).
//   compressed-tensors  format float-quantized, one config group targeting Linear,
//                       weights {num_bits 8, type float, strategy tensor | channel |
//                       block [128, 128]} -> weight_scale [1] | [N][1] | blocks.
//   modelopt            quant_algo FP8 (weight_scale []) or FP8_PER_CHANNEL_PER_TOKEN
//                       (weight_scale [N]).
// A config that declares only a KV cache scheme quantizes no weights.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "numerics/fp8_weights.h"

namespace fp8kv {

enum class WeightQuantMethod : uint8_t { none, fp8, compressed_tensors, modelopt };
// "none" | "fp8" | "compressed-tensors" | "modelopt" (the quant_method spellings).
std::string_view weight_quant_method_name(WeightQuantMethod m);

struct WeightQuantConfig {
  WeightQuantMethod method = WeightQuantMethod::none;
  ScaleGranularity granularity = ScaleGranularity::tensor;
  std::string scale_suffix;             // "weight_scale_inv" | "weight_scale" (tensor name after the module)
  std::string activation_scheme;        // "dynamic" | "static" | "none" (as declared; W8A8 runs dynamic)
  std::vector<std::string> excluded;    // modules_to_not_convert | ignore | exclude_modules, as written
  std::string source;                   // "config.json" or "hf_quant_config.json" (for messages)
  std::string field;                    // the declaring field, e.g. "quantization_config"

  bool quantized() const { return method != WeightQuantMethod::none; }
  // True when `module` (a checkpoint name without ".weight", e.g.
  // "model.layers.0.mlp.down_proj" or "lm_head") stays unquantized, by the
  // format's own matching rule: fp8 a substring (transformers), compressed-
  // tensors the exact name or "re:" + a regex matched from the start,
  // modelopt an fnmatch pattern (* and ?).
  bool is_excluded(const std::string& module) const;
  // The excluded list's field name ("modules_to_not_convert", "ignore", "exclude_modules").
  std::string excluded_field() const;
  // One line: "fp8 e4m3 weights, block 128x128 scales (weight_scale_inv), activations dynamic,
  // quant_method fp8 (config.json quantization_config)".
  std::string describe() const;
};

// config: the whole config.json; hf_quant: hf_quant_config.json's content or
// nullptr. config.json's quantization_config wins when it quantizes weights.
// Throws InputError "<source>: field '<path>': <what>; supported: ...".
WeightQuantConfig parse_weight_quant_config(const nlohmann::json& config, const std::string& config_source,
                                            const nlohmann::json* hf_quant = nullptr,
                                            const std::string& hf_quant_source = "hf_quant_config.json");
// Reads <dir>/hf_quant_config.json when present and combines it with config
// (the hook of load_model_config).
WeightQuantConfig load_weight_quant_config(const std::filesystem::path& dir, const nlohmann::json& config,
                                           const std::string& config_source);

}  // namespace fp8kv
