// The one rule a KV/Q scale value must pass (docs/design.md "Numerics and
// scales"; why these bounds: docs/kv_scales.md "Which values a scale may take").
// Every reader of scales (checkpoint tensors, calibrate reports, the engine)
// asks these two functions, so the same value is refused or warned about the
// same way everywhere.
#pragma once
#include <optional>
#include <string>

namespace fp8kv {

// Bounds: a scale must be a normal float32 (>= 2^-126, so 1/scale is finite);
// values outside [2^-20, 2^20] are accepted with a warning.
inline constexpr float kScaleWarnLow = 0x1p-20f;
inline constexpr float kScaleWarnHigh = 0x1p+20f;

// nullopt when x is an acceptable scale; else why not, as text to follow the
// value's name, e.g. "is NaN (a KV scale must be a finite, normal float32 > 0)".
std::optional<std::string> scale_value_error(float x);
// nullopt when x lies in [2^-20, 2^20]; else a warning text to follow the
// value's name. Only meaningful for values scale_value_error accepts.
std::optional<std::string> scale_value_warning(float x);

}  // namespace fp8kv
