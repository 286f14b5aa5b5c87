#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "io/errors.h"

namespace fp8kv {

int argmax_lowest(std::span<const float> logits) {
  if (logits.empty()) throw std::logic_error("argmax of an empty row");
  int best = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) throw std::runtime_error("non-finite logits (NaN) from the model");
    if (logits[i] > logits[best]) best = static_cast<int>(i);
  }
  return best;
}

double log_softmax_at(std::span<const float> logits, int id) {
  double m = -INFINITY;
  for (float x : logits) m = std::max(m, static_cast<double>(x));
  double s = 0.0;
  for (float x : logits) s += std::exp(static_cast<double>(x) - m);
  return static_cast<double>(logits[id]) - m - std::log(s);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) throw InputError("temperature must be >= 0");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) throw InputError("top_p must be in (0, 1]");
  if (p.top_k < 0) throw InputError("top_k must be >= 0");
}

int Sampler::sample(std::span<const float> logits) {
  if (p_.temperature <= 0.0f) return argmax_lowest(logits);
  const int V = static_cast<int>(logits.size());
  std::vector<int> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  // Descending by logit, ties by id: a total order, so the result is deterministic.
  auto by_logit = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  int keep = V;
  if (p_.top_k > 0 && p_.top_k < V) {
    keep = p_.top_k;
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), by_logit);
  } else {
    std::sort(idx.begin(), idx.end(), by_logit);
  }
  const double t = p_.temperature;
  const double m = logits[idx[0]] / t;
  std::vector<double> prob(keep);
  double sum = 0.0;
  for (int i = 0; i < keep; ++i) {
    prob[i] = std::exp(logits[idx[i]] / t - m);
    sum += prob[i];
  }
  if (p_.top_p < 1.0f) {
    double cum = 0.0;
    int n = 0;
    while (n < keep) {
      cum += prob[n] / sum;
      ++n;
      if (cum >= p_.top_p) break;
    }
    keep = n;
    sum = 0.0;
    for (int i = 0; i < keep; ++i) sum += prob[i];
  }
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * sum;
  double acc = 0.0;
  for (int i = 0; i < keep; ++i) {
    acc += prob[i];
    if (u < acc) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace fp8kv
