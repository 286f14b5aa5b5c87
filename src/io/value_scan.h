// Scans tensor values for NaN and infinities, on the raw bit patterns (no
// conversion, no copy): what `fp8kv inspect --check-values` runs over every
// floating-point tensor of a checkpoint (docs/checkpoints.md "Values").
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "io/safetensors.h"

namespace fp8kv {

struct NonFiniteValue {
  int64_t index = 0;  // flat (row-major) element index
  std::string what;   // "NaN", "inf" or "-inf"
};
// The first non-finite element of a floating-point tensor (F64, F32, F16,
// BF16, F8_E4M3 (NaN only: it has no infinities), F8_E5M2); nullopt when
// every value is finite or the dtype is not floating point.
std::optional<NonFiniteValue> first_non_finite(const TensorView& v);

}  // namespace fp8kv
