// Random weights for the tensors of test checkpoints written to disk.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace fp8kv::test_util {

// Values for a tensor of `shape`: a vector (a norm weight) 1 + 0.1 x nd, a
// matrix nd, drawn in order from rng.
inline std::vector<float> random_weight_values(const std::vector<int64_t>& shape, std::mt19937_64& rng,
                                               std::normal_distribution<float>& nd) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  const bool vec = shape.size() == 1;
  for (auto& x : v) x = vec ? 1.0f + 0.1f * nd(rng) : nd(rng);
  return v;
}

}  // namespace fp8kv::test_util
