// Qwen3.5 pieces of the CPU backend (cpu_backend_gdn.cpp): the Gated
// DeltaNet weights as backend Tensors.
#pragma once
#include "backend/backend.h"
#include "model/weights.h"

namespace fp8kv {

// Sets o's linear-attention Tensors (zero-copy views) from L's, when L is a
// Gated DeltaNet layer; leaves them empty otherwise. Throws InputError for a
// projection stored other than bf16 or f32 (fp8 Gated DeltaNet projections
// are not supported yet).
void bind_linear_attention_weights(const LayerWeights& L, BackendLayerWeights& o);

}  // namespace fp8kv
