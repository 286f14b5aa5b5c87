// The calibration observer: attached at the engine's single store point, it
// sees exactly the Q, K and V values a quantized cache would store (K after
// k_norm and RoPE, V as projected, Q after q_norm and RoPE) and accumulates,
// per layer and stream, the per-head |x| maxima, counts, and a histogram for
// a high percentile.
//
// Percentile method (documented bound): |x| is binned by its bf16 bucket, the
// top 16 bits of the float32 pattern (8 exponent bits, 7 mantissa bits), so a
// bin [lo, hi) has hi / lo <= 1 + 2^-7. percentile() returns the upper edge of
// the bin holding the nearest-rank element (rank ceil(p * n)), clamped to the
// exact amax: for a normal result it is >= the exact percentile and at most
// 0.79% above it. Counts are integers, so the result does not depend on the
// order or threading of observations.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/store_observer.h"

namespace fp8kv {

struct StreamStats {
  static constexpr int kBins = 1 << 15;  // |x| bf16 buckets (sign dropped)
  std::vector<float> head_amax;           // max finite |x| per head
  uint64_t values = 0;                    // elements seen (finite or not)
  uint64_t nonfinite = 0;                 // NaN / inf elements
  std::vector<uint64_t> hist;             // kBins counts of finite |x|

  void add(const float* x, int num_tokens, int heads, int head_dim);
  float amax() const;  // max over heads (0 before any value)
  // Nearest-rank percentile of finite |x|, p in (0, 1]; see the header comment.
  float percentile(double p) const;
};

struct LayerStats {
  StreamStats q, k, v;
  uint64_t tokens = 0;       // tokens observed (each token once per layer)
  uint64_t observe_calls = 0;
};

class CalibrationObserver : public StoreObserver {
 public:
  // kv_cache: per layer, whether it has a KV cache (KvScaleShape::kv_cache);
  // empty: every layer. A layer without one (linear_attention) is never
  // stored to, so it is not expected to be observed and gets no report entry.
  explicit CalibrationObserver(int num_layers, std::vector<bool> kv_cache = {});
  void observe(int layer, const float* q, int num_q_heads, const float* k, const float* v, int num_kv_heads,
               int head_dim, int num_tokens) override;

  int num_layers() const { return static_cast<int>(layers_.size()); }
  bool has_kv_cache(int l) const { return kv_cache_.empty() || kv_cache_.at(static_cast<size_t>(l)); }
  const LayerStats& layer(int l) const { return layers_.at(static_cast<size_t>(l)); }

 private:
  std::vector<LayerStats> layers_;
  std::vector<bool> kv_cache_;
};

}  // namespace fp8kv
