// RopeTable against the formulas written out in double (transformers'
// modeling_rope_utils), for default, linear, llama3 and yarn.
#include <gtest/gtest.h>

#include <cmath>

#include "../common/rope_params.h"
#include "model/rope.h"

namespace fp8kv {
namespace {

// inv_freq computed in fp32 by transformers; compared to double formulas the
// difference is a few fp32 roundings: relative 1e-6.
void expect_close(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6 * want[i] + 1e-30) << i;
}

std::vector<double> base_freq(double theta, int dim) {
  std::vector<double> f(dim / 2);
  for (int i = 0; i < dim / 2; ++i) f[i] = 1.0 / std::pow(theta, 2.0 * i / dim);
  return f;
}

TEST(Rope, DefaultAndLinear) {
  RopeParams p;
  p.theta = 10000.0;
  expect_close(RopeTable(p, 64, 2048).inv_freq(), base_freq(10000.0, 64));
  p.type = "linear";
  p.factor = 4.0;
  auto want = base_freq(10000.0, 64);
  for (auto& x : want) x /= 4.0;
  expect_close(RopeTable(p, 64, 2048).inv_freq(), want);
}

TEST(Rope, Llama3) {
  const RopeParams p = test_util::llama3_rope(8192);
  auto f = base_freq(500000.0, 128);
  const double lw = 8192 / 1.0, hw = 8192 / 4.0;
  for (auto& x : f) {
    const double wl = 2 * M_PI / x;
    if (wl > lw) {
      x /= 8.0;
    } else if (wl >= hw) {
      const double s = (8192 / wl - 1.0) / (4.0 - 1.0);
      x = (1 - s) * x / 8.0 + s * x;
    }
  }
  expect_close(RopeTable(p, 128, 131072).inv_freq(), f);
}

TEST(Rope, YarnRampAndAttentionFactor) {
  const RopeParams p = test_util::yarn_rope(10000.0, 64);
  const int dim = 16;
  RopeTable t(p, dim, 256);
  EXPECT_NEAR(t.attention_factor(), 0.1 * std::log(4.0) + 1.0, 1e-6);
  auto corr = [&](double rot) { return dim * std::log(64 / (rot * 2 * M_PI)) / (2 * std::log(10000.0)); };
  double lo = std::max(0.0, std::floor(corr(32))), hi = std::min(dim - 1.0, std::ceil(corr(1)));
  if (lo == hi) hi += 0.001;
  auto f = base_freq(10000.0, dim);
  for (int i = 0; i < dim / 2; ++i) {
    const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0), extra = 1 - ramp;
    f[i] = f[i] / 4.0 * (1 - extra) + f[i] * extra;
  }
  expect_close(t.inv_freq(), f);
  // cos/sin carry the attention factor.
  const int pos[1] = {5};
  std::vector<float> c(dim / 2), s(dim / 2);
  t.fill(pos, 1, c.data(), s.data());
  for (int i = 0; i < dim / 2; ++i) {
    EXPECT_NEAR(c[i], std::cos(5 * f[i]) * t.attention_factor(), 1e-5);
    EXPECT_NEAR(s[i], std::sin(5 * f[i]) * t.attention_factor(), 1e-5);
  }
}

TEST(Rope, UnknownTypeIsAnError) {
  RopeParams p;
  p.type = "longrope";
  EXPECT_ANY_THROW(RopeTable(p, 64, 2048));
}

}  // namespace
}  // namespace fp8kv
