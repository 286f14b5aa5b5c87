// Calibration rules: from an observed |x| maximum (amax) to a KV scale, for a
// target fp8 format whose largest finite value is M (448 e4m3, 57344 e5m2).
//   safety:m  -> amax * m / M rounded up to the next bf16-representable value
//                (default safety:1.3: amax lands at M / m, a margin of m for
//                values above the calibration amax; no floor, so a stream
//                whose amax is far below M still uses the format's range)
//   amax      -> amax / M rounded up to the next bf16-representable value
//                (the smallest bf16 scale that keeps amax in range; safety:1)
//   modelopt  -> max(amax / M, 1)           (ModelOpt's export rule, floored at 1:
//                a stream with amax < M runs at unity scale, low in the format)
// A stream whose amax is 0 (all values zero) gets 1.0 under every rule: any
// scale stores zeros exactly, and 0 is not a valid scale.
#pragma once
#include <string>
#include <string_view>

#include "numerics/fp8.h"

namespace fp8kv {

struct ScaleRule {
  enum class Kind { safety, amax, modelopt } kind = Kind::safety;
  double margin = 1.3;  // safety only
  static constexpr double kMaxMargin = 16.0;

  // "safety:1.3" | "amax" | "modelopt". Throws std::invalid_argument naming
  // the accepted forms; the margin must be in [1, kMaxMargin].
  static ScaleRule parse(std::string_view s);
  std::string name() const;  // canonical form, e.g. "safety:1.3"

  // The scale for one stream (amax finite and >= 0). Always finite and > 0.
  float scale_for(float amax, KvDtype target) const;
};

// Smallest bf16-representable float >= x (x finite, >= 0).
float ceil_to_bf16(double x);

}  // namespace fp8kv
