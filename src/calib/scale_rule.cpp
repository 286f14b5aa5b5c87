#include "calib/scale_rule.h"

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

namespace fp8kv {

namespace {
[[noreturn]] void bad_rule(std::string_view s, std::string_view why) {
  throw std::invalid_argument(
      fmt::format("--rule '{}': {} (expected safety:M with 1 <= M <= {}, e.g. safety:1.3, or amax, or modelopt)", s, why, ScaleRule::kMaxMargin));
}
}  // namespace

ScaleRule ScaleRule::parse(std::string_view s) {
  ScaleRule r;
  if (s == "amax") { r.kind = Kind::amax; r.margin = 1.0; return r; }
  if (s == "modelopt") { r.kind = Kind::modelopt; r.margin = 1.0; return r; }
  if (s == "safety") return r;
  if (s.substr(0, 7) != "safety:") bad_rule(s, "unknown rule");
  const std::string num(s.substr(7));
  if (num.empty()) bad_rule(s, "missing margin");
  char* end = nullptr;
  const double m = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size()) bad_rule(s, "margin is not a number");
  if (!std::isfinite(m) || m < 1.0) bad_rule(s, "margin must be finite and >= 1");
  // A larger margin puts the calibration amax below M / 16, deep in the
  // format's low exponents where values lose precision and small ones flush
  // to zero: a mistake, not a choice (modelopt is the rule with a floor).
  if (m > kMaxMargin) bad_rule(s, fmt::format("margin {} is above {}", m, kMaxMargin));
  r.kind = Kind::safety;
  r.margin = m;
  return r;
}

std::string ScaleRule::name() const {
  switch (kind) {
    case Kind::amax: return "amax";
    case Kind::modelopt: return "modelopt";
    case Kind::safety: return fmt::format("safety:{}", margin);
  }
  return "?";
}

float ceil_to_bf16(double x) {
  if (!(x >= 0.0) || !std::isfinite(x)) throw std::invalid_argument("ceil_to_bf16: x must be finite and >= 0");
  const float f = static_cast<float>(x);  // nearest float (may be below x)
  uint32_t b = f32_bits(f) & 0xffff0000u;  // truncate toward zero: a bf16 <= f
  if (static_cast<double>(bits_f32(b)) < x) b += 0x10000u;  // next bf16 up (carries into the exponent)
  return bits_f32(b);
}

float ScaleRule::scale_for(float amax, KvDtype target) const {
  if (!std::isfinite(amax) || amax < 0.0f) throw std::invalid_argument("ScaleRule: amax must be finite and >= 0");
  if (!kv_dtype_per_tensor_scaled(target))
    throw std::invalid_argument("ScaleRule: the target must be a per-tensor fp8 format (fp8_e4m3, fp8_e5m2)");
  if (amax == 0.0f) return 1.0f;
  const double M = kv_dtype_max(target);
  const double a = static_cast<double>(amax);
  if (kind == Kind::modelopt) {
    const double s = std::max(a / M, 1.0);
    float f = static_cast<float>(s);  // rounded up, never down
    if (static_cast<double>(f) < s) f = std::nextafter(f, INFINITY);
    return f;
  }
  // safety:m and amax (= safety:1): rounded up to bf16, never down, so that
  // amax / scale <= M / margin holds after rounding and the scale survives a
  // bf16 checkpoint unchanged. At least the smallest normal float32: a
  // subnormal scale has no finite reciprocal (numerics/scale_check.h).
  const double s = std::max(a * (kind == Kind::safety ? margin : 1.0) / M, static_cast<double>(FLT_MIN));
  return ceil_to_bf16(s);
}

}  // namespace fp8kv
