// W8A8's activation rounding in its two forms (numerics/fp8_weights.h):
// quantize_activations_e4m3 (codes and scales, what an fp8 GEMM reads and
// what the CUDA quantization kernel must reproduce bit for bit) against
// round_activations_e4m3 (the values the CPU linear computes with).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "numerics/fp8.h"
#include "numerics/fp8_weights.h"

using namespace fp8kv;

namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

// Rows with the awkward cases: zeros (and -0), a NaN among normal values, a
// huge value (every other element of its group flushes to small codes),
// denormal inputs, a group whose amax is a denormal (amax / 448 underflows),
// and plain normals.
std::vector<float> awkward_rows(std::mt19937_64& rng, int64_t T, int64_t K) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(T * K));
  for (auto& v : x) v = nd(rng);
  auto row = [&](int64_t t) { return x.data() + t * K; };
  if (T > 0) std::fill(row(0), row(0) + K, 0.0f);
  if (T > 1) {
    std::fill(row(1), row(1) + K, 0.0f);
    row(1)[3] = -0.0f;
    row(1)[K - 1] = std::numeric_limits<float>::quiet_NaN();
  }
  if (T > 2) row(2)[5] = std::numeric_limits<float>::quiet_NaN();
  if (T > 3) row(3)[K / 2] = 3.0e38f;
  if (T > 4)
    for (int64_t c = 0; c < K; ++c) row(4)[c] = nd(rng) * 1e-39f;  // denormal inputs
  if (T > 5)
    for (int64_t c = 0; c < K; ++c) row(5)[c] = (c % 3 ? 1.0f : -1.0f) * std::numeric_limits<float>::denorm_min() * (c % 7);
  if (T > 6)
    for (int64_t c = 0; c < K; ++c) row(6)[c] *= 1e30f;
  return x;
}

TEST(Fp8Activations, CodesAndScalesAreTheRoundedValues) {
  std::mt19937_64 rng(5);
  for (int64_t K : {16, 128, 200, 384, 4096}) {
    for (int64_t group : {int64_t{128}, K}) {
      const int64_t T = 9, G = (K + group - 1) / group;
      const std::vector<float> x = awkward_rows(rng, T, K);
      std::vector<float> rounded = x;
      round_activations_e4m3(rounded.data(), T, K, group);
      std::vector<uint8_t> q(static_cast<size_t>(T * K));
      std::vector<float> s(static_cast<size_t>(T * G));
      quantize_activations_e4m3(x.data(), T, K, group, q.data(), s.data());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < K; ++c) {
          const float sc = s[t * G + c / group];
          const float v = e4m3_to_f32(q[t * K + c]) * sc, want = rounded[t * K + c];
          if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(v)) << "K=" << K << " group=" << group << " t=" << t << " c=" << c;
            continue;
          }
          ASSERT_EQ(bits(v), bits(want)) << "K=" << K << " group=" << group << " t=" << t << " c=" << c << ": "
                                         << v << " vs " << want;
        }
      // Zero groups: scale 1, codes of +-0.
      EXPECT_EQ(s[0], 1.0f);
      EXPECT_EQ(q[0], 0x00);
      EXPECT_EQ(q[K + 3], 0x80);
      EXPECT_EQ(q[K + K - 1], 0x7f);
      // amax / 448 with IEEE division.
      float amax = 0;
      for (int64_t c = 0; c < std::min(group, K); ++c) amax = std::max(amax, std::fabs(x[2 * K + c]));
      EXPECT_EQ(bits(s[2 * G]), bits(amax / 448.0f));
    }
  }
}

}  // namespace
