// Quantization statistics used by calibration and evaluation.
#pragma once
#include <cstdint>
#include <span>

#include "numerics/fp8.h"

namespace fp8kv {

// Accumulates statistics of quantizing values x with a given scale into a
// cache dtype. Merge-able; fixed-order loops so results do not depend on the
// number of threads when each thread merges in a fixed order.
struct QuantStats {
  double amax = 0.0;           // max |x| over finite x
  uint64_t count = 0;          // values seen
  uint64_t nonfinite = 0;      // NaN or inf inputs
  uint64_t clipped = 0;        // |x / s| beyond the format's max finite (per-token-head dtypes: where
                               // saturation changes the stored value, quant_stats.cpp)
  uint64_t flushed = 0;        // x != 0 but quantizes to (+-)0
  double sum_sq = 0.0;         // sum x^2
  double sum_sq_err = 0.0;     // sum (x - deq(q(x)))^2

  void add(std::span<const float> x, float scale, KvDtype d);
  void merge(const QuantStats& o);
  // ||x - deq(q(x))||_2 / ||x||_2 (0 when all x are 0).
  double rt_rel_err() const;
  double clip_frac() const { return count ? static_cast<double>(clipped) / count : 0.0; }
  double flush_frac() const { return count ? static_cast<double>(flushed) / count : 0.0; }
};

// max |x| over finite elements (NaN/inf ignored).
float amax(std::span<const float> x);

}  // namespace fp8kv
