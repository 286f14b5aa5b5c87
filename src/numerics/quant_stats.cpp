#include "numerics/quant_stats.h"

#include <algorithm>
#include <cmath>

namespace fp8kv {

float amax(std::span<const float> x) {
  float m = 0.0f;
  for (float v : x) {
    const float a = std::fabs(v);
    if (std::isfinite(a)) m = std::max(m, a);
  }
  return m;
}

namespace {
// Per tensor: |x / s| beyond the max finite M. Per token head, where the peak
// maps to M up to the f32 rounding of amax / (amax / M): where saturation
// changes the stored value, i.e. round-to-nearest-even alone would exceed M
// (e4m3: |y| > 464, half the top step 32 above 448; int8: |y| >= 127.5).
bool saturates(float scaled, KvDtype d, float maxv) {
  const float a = std::fabs(scaled);
  if (d == KvDtype::fp8_e4m3_pth) return a > 464.0f;
  if (d == KvDtype::int8_pth) return a >= 127.5f;
  return a > maxv;
}
}  // namespace

void QuantStats::add(std::span<const float> x, float scale, KvDtype d) {
  const float maxv = kv_dtype_max(d);
  for (float v : x) {
    ++count;
    if (!std::isfinite(v)) { ++nonfinite; continue; }
    const double a = std::fabs(static_cast<double>(v));
    amax = std::max(amax, a);
    const float scaled = d == KvDtype::bf16 ? v : v / scale;
    if (saturates(scaled, d, maxv)) ++clipped;
    const float r = roundtrip(v, scale, d);
    if (v != 0.0f && r == 0.0f) ++flushed;
    const double e = static_cast<double>(v) - static_cast<double>(r);
    sum_sq += a * a;
    sum_sq_err += e * e;
  }
}

void QuantStats::merge(const QuantStats& o) {
  amax = std::max(amax, o.amax);
  count += o.count;
  nonfinite += o.nonfinite;
  clipped += o.clipped;
  flushed += o.flushed;
  sum_sq += o.sum_sq;
  sum_sq_err += o.sum_sq_err;
}

double QuantStats::rt_rel_err() const {
  if (sum_sq <= 0.0) return 0.0;
  return std::sqrt(sum_sq_err / sum_sq);
}

}  // namespace fp8kv
