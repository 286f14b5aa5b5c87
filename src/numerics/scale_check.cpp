#include "numerics/scale_check.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace fp8kv {

namespace {
constexpr const char* kRule = "a KV scale must be a finite, normal float32 > 0";
}

std::optional<std::string> scale_value_error(float x) {
  if (std::isnan(x)) return fmt::format("is NaN ({})", kRule);
  if (std::isinf(x)) return fmt::format("is {} ({})", x > 0 ? "inf" : "-inf", kRule);
  if (x == 0.0f) return fmt::format("is 0 ({})", kRule);
  if (x < 0.0f) return fmt::format("is negative ({:.9g}) ({})", x, kRule);
  if (x < std::numeric_limits<float>::min())
    return fmt::format(
        "is {:.9g}, a subnormal float32 (below 2^-126 = 1.17549435e-38): 1/scale is not finite, so quantization "
        "divides by it into inf ({})",
        x, kRule);
  if (!std::isfinite(1.0f / x)) return fmt::format("is {:.9g}: its reciprocal is not finite ({})", x, kRule);
  return std::nullopt;
}

std::optional<std::string> scale_value_warning(float x) {
  if (x >= kScaleWarnLow && x <= kScaleWarnHigh) return std::nullopt;
  return fmt::format(
      "is {:.9g}, outside [2^-20, 2^20]: accepted, but no activation range calibrates to it (check the checkpoint's "
      "scale convention: fp8kv stores x / scale)",
      x);
}

}  // namespace fp8kv
