// Token selection from a logits row: greedy (ties -> lowest id) or
// temperature / top-k / top-p sampling with a seeded generator (the same
// seed and logits give the same token on every machine).
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <span>

#include "engine/engine.h"

namespace fp8kv {

// Index of the largest value; ties -> lowest index. NaN rows throw.
int argmax_lowest(std::span<const float> logits);
// log softmax(logits)[id], computed in double.
double log_softmax_at(std::span<const float> logits, int id);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);  // throws InputError on bad params
  int sample(std::span<const float> logits);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace fp8kv
