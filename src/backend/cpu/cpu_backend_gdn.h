// Qwen3.5 pieces of the CPU backend (cpu_backend_gdn.cpp): the Gated
// DeltaNet weights as backend Tensors.
#pragma once
#include "backend/backend.h"
#include "model/weights.h"

namespace fp8kv {

// Sets o's linear-attention vectors (zero-copy views: conv1d, A_log,
// dt_bias, the gated norm) from L's, when L is a Gated DeltaNet layer;
// leaves them empty otherwise. The layer's projections are bound with the
// other matrices (any stored dtype, fp8 with its scales included).
void bind_linear_attention_vectors(const LayerWeights& L, BackendLayerWeights& o);

}  // namespace fp8kv
