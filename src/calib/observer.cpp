#include "calib/observer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "numerics/fp8.h"

namespace fp8kv {

void StreamStats::add(const float* x, int num_tokens, int heads, int head_dim) {
  if (head_amax.empty()) head_amax.assign(static_cast<size_t>(heads), 0.0f);
  if (static_cast<int>(head_amax.size()) != heads)
    throw std::invalid_argument(fmt::format("calibration observer: {} heads after {}", heads, head_amax.size()));
  if (hist.empty()) hist.assign(kBins, 0);
  for (int t = 0; t < num_tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      const float* row = x + (static_cast<size_t>(t) * heads + h) * head_dim;
      float m = head_amax[h];
      for (int d = 0; d < head_dim; ++d) {
        const float a = std::fabs(row[d]);
        if (!std::isfinite(a)) {
          ++nonfinite;
          continue;
        }
        m = std::max(m, a);
        ++hist[f32_bits(a) >> 16];
      }
      head_amax[h] = m;
    }
  }
  values += static_cast<uint64_t>(num_tokens) * heads * head_dim;
}

float StreamStats::amax() const {
  float m = 0.0f;
  for (float a : head_amax) m = std::max(m, a);
  return m;
}

float StreamStats::percentile(double p) const {
  const uint64_t n = values - nonfinite;
  if (n == 0 || hist.empty()) return 0.0f;
  if (!(p > 0.0 && p <= 1.0)) throw std::invalid_argument("percentile: p must be in (0, 1]");
  // Nearest rank, computed in integers where p is a ratio of 1e6 steps.
  const uint64_t ppm = static_cast<uint64_t>(std::llround(p * 1e6));
  uint64_t rank = (n / 1000000u) * ppm + ((n % 1000000u) * ppm + 999999u) / 1000000u;
  rank = std::clamp<uint64_t>(rank, 1, n);
  uint64_t cum = 0;
  for (int b = 0; b < kBins; ++b) {
    cum += hist[b];
    if (cum >= rank) {
      const float upper = bits_f32(static_cast<uint32_t>(b + 1) << 16);
      return std::min(upper, amax());
    }
  }
  return amax();
}

CalibrationObserver::CalibrationObserver(int num_layers, std::vector<bool> kv_cache)
    : layers_(static_cast<size_t>(num_layers)), kv_cache_(std::move(kv_cache)) {
  if (!kv_cache_.empty() && static_cast<int>(kv_cache_.size()) != num_layers)
    throw std::invalid_argument(
        fmt::format("calibration observer: kv_cache has {} entries for {} layers", kv_cache_.size(), num_layers));
}

void CalibrationObserver::observe(int layer, const float* q, int num_q_heads, const float* k, const float* v,
                                  int num_kv_heads, int head_dim, int num_tokens) {
  if (layer < 0 || layer >= num_layers())
    throw std::out_of_range(fmt::format("calibration observer: layer {} of {}", layer, num_layers()));
  if (!has_kv_cache(layer))
    throw std::logic_error(fmt::format("calibration observer: a store at layer {}, which has no KV cache", layer));
  LayerStats& L = layers_[static_cast<size_t>(layer)];
  if (num_tokens <= 0) return;
  if (q) L.q.add(q, num_tokens, num_q_heads, head_dim);
  L.k.add(k, num_tokens, num_kv_heads, head_dim);
  L.v.add(v, num_tokens, num_kv_heads, head_dim);
  L.tokens += static_cast<uint64_t>(num_tokens);
  ++L.observe_calls;
}

}  // namespace fp8kv
