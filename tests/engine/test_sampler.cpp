#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/sampler.h"
#include "io/errors.h"

namespace fp8kv {
namespace {

TEST(Sampler, GreedyTiesGoToLowestId) {
  const std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(argmax_lowest(l), 1);
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.sample(l), 1);
}

TEST(Sampler, LogSoftmaxIsNormalized) {
  const std::vector<float> l = {1.0f, 2.0f, 3.0f, 100.0f};
  double sum = 0.0;
  for (int i = 0; i < 4; ++i) sum += std::exp(log_softmax_at(l, i));
  EXPECT_NEAR(sum, 1.0, 1e-12);
  EXPECT_NEAR(log_softmax_at(l, 3), -(std::exp(-97.0) + std::exp(-98.0) + std::exp(-99.0)), 1e-15);
}

TEST(Sampler, TopKOneIsGreedyAndSeedsReproduce) {
  const std::vector<float> l = {0.1f, 0.3f, 0.2f, 0.25f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 1;
  Sampler s(p);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(l), 1);
  p.top_k = 0;
  p.seed = 42;
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(l), b.sample(l));
}

// Frequencies follow softmax(l / T) (and top-p removes the tail): with N
// draws, each frequency is within 5 standard deviations sqrt(p(1-p)/N).
TEST(Sampler, FrequenciesFollowTheDistribution) {
  const std::vector<float> l = {0.0f, 1.0f, 2.0f, -3.0f};
  SamplingParams p;
  p.temperature = 2.0f;
  p.seed = 7;
  Sampler s(p);
  const int N = 40000;
  std::vector<int> n(4);
  for (int i = 0; i < N; ++i) ++n[s.sample(l)];
  double z = 0.0;
  for (float x : l) z += std::exp(x / 2.0);
  for (int i = 0; i < 4; ++i) {
    const double pi = std::exp(l[i] / 2.0) / z;
    EXPECT_NEAR(n[i] / double(N), pi, 5 * std::sqrt(pi * (1 - pi) / N)) << i;
  }
  // top_p = 0.6 keeps ids 2 (0.50) and 1 (0.30) only.
  p.top_p = 0.6f;
  Sampler t(p);
  for (int i = 0; i < 2000; ++i) {
    const int id = t.sample(l);
    EXPECT_TRUE(id == 1 || id == 2) << id;
  }
}

TEST(Sampler, BadParamsAreInputErrors) {
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_THROW(Sampler{p}, InputError);
  p = {};
  p.temperature = -1.0f;
  EXPECT_THROW(Sampler{p}, InputError);
  p = {};
  p.top_k = -2;
  EXPECT_THROW(Sampler{p}, InputError);
  const std::vector<float> nan = {0.0f, NAN};
  EXPECT_THROW(argmax_lowest(nan), std::runtime_error);
}

}  // namespace
}  // namespace fp8kv
