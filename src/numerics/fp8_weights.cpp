#include "numerics/fp8_weights.h"

#include <algorithm>
#include <cmath>

#include "numerics/fp8.h"

namespace fp8kv {

namespace {
constexpr float kE4m3Max = 448.0f;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

float fp8_scale_from_amax(float amax) { return amax > 0.0f ? amax / kE4m3Max : 1.0f; }

std::string_view scale_granularity_name(ScaleGranularity g) {
  switch (g) {
    case ScaleGranularity::tensor: return "tensor";
    case ScaleGranularity::channel: return "channel";
    case ScaleGranularity::block128: return "block 128x128";
  }
  return "?";
}

std::string_view fp8_compute_name(Fp8Compute c) { return c == Fp8Compute::w8a8 ? "w8a8" : "w8a16"; }

std::pair<int64_t, int64_t> fp8_scale_shape(ScaleGranularity g, int64_t N, int64_t K) {
  switch (g) {
    case ScaleGranularity::tensor: return {1, 1};
    case ScaleGranularity::channel: return {N, 1};
    case ScaleGranularity::block128: return {ceil_div(N, kFp8WeightBlock), ceil_div(K, kFp8WeightBlock)};
  }
  return {0, 0};
}

void dequantize_fp8_weight_rows(const uint8_t* q, const Fp8WeightScales& s, int64_t N, int64_t K, int64_t r0,
                                int64_t n, float* out) {
  float table[256];
  for (int i = 0; i < 256; ++i) table[i] = e4m3_to_f32(static_cast<uint8_t>(i));
  const int64_t kb = ceil_div(K, kFp8WeightBlock);
  (void)N;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = r0 + i;
    const uint8_t* src = q + r * K;
    float* dst = out + i * K;
    if (s.granularity == ScaleGranularity::block128) {
      const float* srow = s.data + (r / kFp8WeightBlock) * kb;
      for (int64_t c0 = 0; c0 < K; c0 += kFp8WeightBlock) {
        const float sc = srow[c0 / kFp8WeightBlock];
        const int64_t c1 = std::min(K, c0 + kFp8WeightBlock);
        for (int64_t c = c0; c < c1; ++c) dst[c] = table[src[c]] * sc;
      }
    } else {
      const float sc = s.granularity == ScaleGranularity::channel ? s.data[r] : s.data[0];
      for (int64_t c = 0; c < K; ++c) dst[c] = table[src[c]] * sc;
    }
  }
}

namespace {
// A W8A8 activation group's amax: std::max(amax, |x|) ignores a NaN |x|.
float group_amax(const float* x, int64_t c0, int64_t c1) {
  float amax = 0.0f;
  for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[c]));
  return amax;
}
}  // namespace

void round_activations_e4m3(float* x, int64_t T, int64_t K, int64_t group) {
  if (group <= 0) group = K;
  for (int64_t t = 0; t < T; ++t) {
    float* row = x + t * K;
    for (int64_t c0 = 0; c0 < K; c0 += group) {
      const int64_t c1 = std::min(K, c0 + group);
      const float amax = group_amax(row, c0, c1);
      if (!(amax > 0.0f)) continue;  // zeros stay zeros, NaNs stay NaN (amax ignores them)
      const float s = amax / kE4m3Max;
      for (int64_t c = c0; c < c1; ++c) row[c] = e4m3_to_f32(f32_to_e4m3(row[c] / s)) * s;
    }
  }
}

void quantize_activations_e4m3(const float* x, int64_t T, int64_t K, int64_t group, uint8_t* q, float* scales) {
  if (group <= 0) group = K;
  const int64_t groups = ceil_div(K, group);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = x + t * K;
    uint8_t* qr = q + t * K;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * group, c1 = std::min(K, c0 + group);
      const float amax = group_amax(row, c0, c1);
      const float s = amax > 0.0f ? amax / kE4m3Max : 1.0f;
      scales[t * groups + g] = s;
      for (int64_t c = c0; c < c1; ++c) qr[c] = f32_to_e4m3(row[c] / s);
    }
  }
}

Fp8QuantizedWeight quantize_weight_e4m3(const float* w, int64_t N, int64_t K, ScaleGranularity g) {
  Fp8QuantizedWeight o;
  const auto [sr, sc] = fp8_scale_shape(g, N, K);
  o.scales.assign(static_cast<size_t>(sr * sc), 0.0f);
  o.q.resize(static_cast<size_t>(N * K));
  auto cell = [&, sc = sc](int64_t r, int64_t c) -> int64_t {
    return g == ScaleGranularity::tensor    ? 0
           : g == ScaleGranularity::channel ? r
                                            : (r / kFp8WeightBlock) * sc + c / kFp8WeightBlock;
  };
  for (int64_t r = 0; r < N; ++r)  // amax per scale cell
    for (int64_t c = 0; c < K; ++c) o.scales[cell(r, c)] = std::max(o.scales[cell(r, c)], std::fabs(w[r * K + c]));
  for (auto& s : o.scales) s = fp8_scale_from_amax(s);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < K; ++c) o.q[r * K + c] = f32_to_e4m3(w[r * K + c] / o.scales[cell(r, c)]);
  return o;
}

}  // namespace fp8kv
