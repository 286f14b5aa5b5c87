#include "eval/stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace fp8kv::eval {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64(x);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint64_t Rng::below(uint64_t n) {
  if (n == 0) throw std::invalid_argument("Rng::below: n must be > 0");
  // Reject the top partial range so every residue is equally likely.
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % n;
  uint64_t r;
  do r = next();
  while (r >= limit);
  return r % n;
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

double percentile_sorted(std::span<const double> sorted, double q) {
  if (sorted.empty()) throw std::invalid_argument("percentile: empty input");
  if (!(q >= 0.0 && q <= 100.0)) throw std::invalid_argument(fmt::format("percentile: q={} outside [0, 100]", q));
  const double h = (static_cast<double>(sorted.size()) - 1.0) * (q / 100.0);
  const size_t lo = static_cast<size_t>(std::floor(h));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = h - static_cast<double>(lo);
  // numpy's _lerp: a + (b - a) * t, switched to b - (b - a) * (1 - t) for t >= 0.5.
  const double a = sorted[lo], b = sorted[hi];
  const double diff = b - a;
  return frac >= 0.5 ? b - diff * (1.0 - frac) : a + diff * frac;
}

double percentile(std::vector<double> values, double q) {
  for (double v : values)
    if (!std::isfinite(v)) throw std::invalid_argument("percentile: non-finite value");
  std::sort(values.begin(), values.end());
  return percentile_sorted(values, q);
}

double binom_test_half(uint64_t k, uint64_t n) {
  if (k > n) throw std::invalid_argument(fmt::format("binom_test_half: k={} > n={}", k, n));
  if (n == 0) return 1.0;
  const uint64_t m = std::min(k, n - k);
  if (2 * m == n) return 1.0;
  // P(X <= m) for X ~ Bin(n, 1/2). For n < 1000, forward from the exact
  // t_0 = 2^-n by the exact ratio t_i = t_{i-1} (n - i + 1) / i (exact for
  // small n). Beyond, 2^-n underflows: start from the largest term (via
  // lgamma) and sum downward (terms grow with i for i <= m < n/2).
  double sum = 0.0;
  if (n < 1000) {
    double t = std::ldexp(1.0, -static_cast<int>(n));
    for (uint64_t i = 0; i <= m; ++i) {
      if (i > 0) t = t * static_cast<double>(n - i + 1) / static_cast<double>(i);
      sum += t;
    }
  } else {
    const double dn = static_cast<double>(n);
    double t = std::exp(std::lgamma(dn + 1.0) - std::lgamma(static_cast<double>(m) + 1.0) -
                        std::lgamma(static_cast<double>(n - m) + 1.0) - dn * std::log(2.0));
    for (uint64_t i = m + 1; i-- > 0;) {
      sum += t;
      if (t == 0.0) break;
      t *= static_cast<double>(i) / static_cast<double>(n - i + 1);
    }
  }
  return std::min(1.0, 2.0 * sum);
}

double mcnemar_exact_p(uint64_t only_a, uint64_t only_b) {
  return binom_test_half(std::min(only_a, only_b), only_a + only_b);
}

McNemar mcnemar_exact(std::span<const bool> a, std::span<const bool> b) {
  if (a.size() != b.size())
    throw std::invalid_argument(fmt::format("mcnemar: {} outcomes for A vs {} for B (must be paired)", a.size(), b.size()));
  McNemar r;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] && b[i]) ++r.both;
    else if (a[i]) ++r.only_a;
    else if (b[i]) ++r.only_b;
    else ++r.neither;
  }
  r.p_value = mcnemar_exact_p(r.only_a, r.only_b);
  return r;
}

SignFlip sign_flip_test(std::span<const double> d, uint64_t seed, uint64_t mc_resamples, int exact_max_n) {
  if (d.empty()) throw std::invalid_argument("sign_flip_test: no differences");
  if (exact_max_n > 24) throw std::invalid_argument("sign_flip_test: exact_max_n must be <= 24");
  SignFlip r;
  const int n = static_cast<int>(d.size());
  double obs = 0.0, abs_sum = 0.0;
  for (double x : d) {
    if (!std::isfinite(x)) throw std::invalid_argument("sign_flip_test: non-finite difference");
    obs += x;
    abs_sum += std::fabs(x);
    r.n_pos += x > 0;
    r.n_neg += x < 0;
    r.n_zero += x == 0;
  }
  r.mean = obs / n;
  // Sums of the same values in different orders differ by at most about
  // n * eps * sum|d|; equal statistics must count as ties.
  const double tol = 8.0 * n * std::numeric_limits<double>::epsilon() * abs_sum;
  const double thresh = std::fabs(obs) - tol;
  uint64_t hits = 0;
  if (n <= exact_max_n) {
    // Meet in the middle: every assignment's sum is low[a] + high[b].
    const int nl = n / 2, nh = n - nl;
    auto half_sums = [&](int off, int cnt) {
      std::vector<double> s(size_t{1} << cnt);
      for (size_t mask = 0; mask < s.size(); ++mask) {
        double acc = 0.0;
        for (int i = 0; i < cnt; ++i) acc += (mask >> i & 1) ? -d[off + i] : d[off + i];
        s[mask] = acc;
      }
      return s;
    };
    const auto low = half_sums(0, nl), high = half_sums(nl, nh);
    for (double h : high)
      for (double l : low) hits += std::fabs(l + h) >= thresh;
    r.exact = true;
    r.resamples = uint64_t{1} << n;
    r.p_value = std::min(1.0, static_cast<double>(hits) / static_cast<double>(r.resamples));
  } else {
    if (mc_resamples == 0) throw std::invalid_argument("sign_flip_test: mc_resamples must be > 0");
    Rng rng(seed);
    for (uint64_t k = 0; k < mc_resamples; ++k) {
      double acc = 0.0;
      uint64_t bits = 0;
      for (int i = 0; i < n; ++i) {
        if (i % 64 == 0) bits = rng.next();
        acc += (bits >> (i % 64) & 1) ? -d[i] : d[i];
      }
      hits += std::fabs(acc) >= thresh;
    }
    r.exact = false;
    r.resamples = mc_resamples;
    r.p_value = std::min(1.0, static_cast<double>(hits + 1) / static_cast<double>(mc_resamples + 1));
  }
  return r;
}

std::vector<std::vector<uint32_t>> bootstrap_indices(uint32_t n, int resamples, uint64_t seed) {
  if (n == 0) throw std::invalid_argument("bootstrap: empty sample");
  if (resamples <= 0) throw std::invalid_argument("bootstrap: resamples must be > 0");
  Rng rng(seed);
  std::vector<std::vector<uint32_t>> out(static_cast<size_t>(resamples), std::vector<uint32_t>(n));
  for (auto& r : out)
    for (auto& i : r) i = static_cast<uint32_t>(rng.below(n));
  return out;
}

Interval bootstrap_interval(uint32_t n, const Statistic& stat, const std::vector<std::vector<uint32_t>>& resamples,
                            double level) {
  if (!(level > 0.0 && level < 1.0)) throw std::invalid_argument(fmt::format("bootstrap: level {} outside (0, 1)", level));
  if (resamples.empty()) throw std::invalid_argument("bootstrap: no resamples");
  std::vector<uint32_t> ident(n);
  for (uint32_t i = 0; i < n; ++i) ident[i] = i;
  Interval r;
  r.estimate = stat(ident);
  std::vector<double> vals;
  vals.reserve(resamples.size());
  for (const auto& idx : resamples) {
    const double v = stat(idx);
    if (!std::isfinite(v)) throw std::invalid_argument("bootstrap: non-finite resampled statistic");
    vals.push_back(v);
  }
  std::sort(vals.begin(), vals.end());
  r.lo = percentile_sorted(vals, 100.0 * (1.0 - level) / 2.0);
  r.hi = percentile_sorted(vals, 100.0 * (1.0 + level) / 2.0);
  return r;
}

Interval bootstrap_mean_ci(std::span<const double> x, double level, int resamples, uint64_t seed) {
  const auto n = static_cast<uint32_t>(x.size());
  const auto idx = bootstrap_indices(n, resamples, seed);
  auto mean = [&](std::span<const uint32_t> ii) {
    double s = 0.0;
    for (uint32_t i : ii) s += x[i];
    return s / static_cast<double>(ii.size());
  };
  return bootstrap_interval(n, mean, idx, level);
}

}  // namespace fp8kv::eval
