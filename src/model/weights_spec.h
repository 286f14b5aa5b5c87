// The tensors a checkpoint of each supported family must hold, with shapes
// (HF names). Used by `fp8kv inspect` to decide loadability and by the
// weight binder, so both agree on what "loadable" means.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace fp8kv {

class Checkpoint;

// Where the text model lives in the checkpoint's names.
struct WeightNaming {
  std::string prefix = "model.";             // "model." | "model.language_model." | "language_model.model."
  std::string lm_head = "lm_head.weight";    // "lm_head.weight" | "language_model.lm_head.weight"
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Default naming for a config: "model." for *ForCausalLM, transformers 5's
// "model.language_model." for Gemma3ForConditionalGeneration.
WeightNaming default_weight_naming(const ModelConfig& cfg);
// Picks the naming whose embed_tokens the checkpoint holds (Gemma3 multimodal
// checkpoints from the Hub use "language_model.model."); default when none.
WeightNaming detect_weight_naming(const ModelConfig& cfg, const Checkpoint& ckpt);

// Every required tensor with its shape, in a stable order (embeddings, layers
// in order, final norm, lm_head unless tied).
std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg, const WeightNaming& naming);
std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg);  // default naming
std::vector<std::string> expected_tensor_names(const ModelConfig& cfg);

// Optional per-layer KV/Q scale tensors (all spellings docs/design.md "Checkpoints" lists), not
// warned about when present. True for e.g. "model.layers.3.self_attn.k_scale".
bool is_kv_scale_tensor_name(const std::string& name);

// The scale tensors of an FP8-weight checkpoint (model/quant_config.h):
// "<module>.<scale_suffix>" and "<module>.input_scale" when `quant` quantizes.
bool is_weight_quant_tensor_name(const std::string& name, const WeightQuantConfig& quant);

// Checks every expected tensor is present, floating point, with the expected
// shape. Throws InputError naming the file and tensor (expected vs actual).
// Returns the checkpoint tensors that are neither expected nor KV scales.
std::vector<std::string> check_weights(const ModelConfig& cfg, const Checkpoint& ckpt, const WeightNaming& naming);

}  // namespace fp8kv
