// A weight matrix in host memory, as the loader hands it to a backend: the
// CPU backend computes on it, the CUDA backend uploads it (bf16).
#pragma once
#include <cstdint>

#include "numerics/fp8_weights.h"

namespace fp8kv {

enum class WeightType : uint8_t { f32, bf16, f8_e4m3 };

// Row-major matrix [rows][cols] of fp32, bf16 (uint16) or e4m3 (uint8, with
// `scales`) elements.
struct MatrixRef {
  const void* data = nullptr;
  WeightType type = WeightType::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  Fp8WeightScales scales;  // f8_e4m3 only
};

}  // namespace fp8kv
