// `--load-format dummy` (vLLM's name): random weights from config.json alone,
// so that a model shape (e.g. Llama-3.1-8B) can be run and benchmarked
// without its checkpoint. Matrices bf16 ~ N(0, 0.02); norm weights 1 (Gemma:
// 1 + w with w = 0, i.e. also 1); biases 0. Deterministic for a seed and
// fast (counter-based generator, filled in parallel).
#pragma once
#include <cstdint>
#include <memory>

#include "model/config.h"
#include "model/weights.h"

namespace fp8kv {

std::shared_ptr<ModelWeights> dummy_weights(const ModelConfig& cfg, uint64_t seed = 0, float std = 0.02f);

}  // namespace fp8kv
