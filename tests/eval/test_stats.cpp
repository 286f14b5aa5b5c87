// src/eval/stats against exact hand computations and independent brute-force
// references (the scipy goldens are in test_stats_golden.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "eval/stats.h"

using namespace fp8kv::eval;

namespace {

using u128 = unsigned __int128;

// Exact binomial coefficients C(n, i), n <= 120, by Pascal's triangle.
std::vector<u128> pascal_row(int n) {
  std::vector<u128> row{1};
  for (int r = 1; r <= n; ++r) {
    std::vector<u128> next(r + 1);
    next[0] = next[r] = 1;
    for (int i = 1; i < r; ++i) next[i] = row[i - 1] + row[i];
    row = std::move(next);
  }
  return row;
}

// scipy's definition of the two-sided p-value: the total probability of the
// outcomes no more likely than the observed one; exact integer arithmetic.
double exact_two_sided_half(int k, int n) {
  const auto row = pascal_row(n);
  u128 num = 0;
  for (int j = 0; j <= n; ++j)
    if (row[j] <= row[k]) num += row[j];
  const long double p = static_cast<long double>(num) / std::ldexp(1.0L, n);
  return static_cast<double>(std::min(p, 1.0L));
}

// Brute-force sign-flip p-value for integer-valued differences (exact ties).
double brute_sign_flip_int(const std::vector<int>& d) {
  long obs = 0;
  for (int x : d) obs += x;
  const long aobs = obs < 0 ? -obs : obs;
  const uint64_t total = uint64_t{1} << d.size();
  uint64_t hits = 0;
  for (uint64_t mask = 0; mask < total; ++mask) {
    long s = 0;
    for (size_t i = 0; i < d.size(); ++i) s += (mask >> i & 1) ? -d[i] : d[i];
    hits += (s < 0 ? -s : s) >= aobs;
  }
  return static_cast<double>(hits) / static_cast<double>(total);
}

}  // namespace

TEST(Percentile, HandValuesNumpyLinear) {
  const std::vector<double> v{4.0, 1.0, 3.0, 2.0};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);    // h = 1.5
  EXPECT_DOUBLE_EQ(percentile(v, 25), 1.75);   // h = 0.75
  EXPECT_DOUBLE_EQ(percentile(v, 90), 3.7);    // h = 2.7
  EXPECT_DOUBLE_EQ(percentile({7.0}, 99.9), 7.0);
  std::vector<double> big(10001);
  for (int i = 0; i <= 10000; ++i) big[i] = 10000 - i;  // 0..10000 reversed
  EXPECT_DOUBLE_EQ(percentile(big, 99.99), 9999.0);
  EXPECT_DOUBLE_EQ(percentile(big, 12.345), 1234.5);
}

TEST(Percentile, RejectsBadInput) {
  EXPECT_THROW(percentile({}, 50), std::invalid_argument);
  EXPECT_THROW(percentile({1.0}, 101), std::invalid_argument);
  EXPECT_THROW(percentile({1.0}, -1), std::invalid_argument);
  EXPECT_THROW(percentile({1.0, NAN}, 50), std::invalid_argument);
}

TEST(Binom, HandValues) {
  EXPECT_DOUBLE_EQ(mcnemar_exact_p(0, 5), 2.0 / 32.0);
  EXPECT_DOUBLE_EQ(mcnemar_exact_p(5, 0), 2.0 / 32.0);
  EXPECT_DOUBLE_EQ(mcnemar_exact_p(1, 9), 2.0 * 11.0 / 1024.0);
  EXPECT_DOUBLE_EQ(mcnemar_exact_p(0, 0), 1.0);
  EXPECT_DOUBLE_EQ(mcnemar_exact_p(3, 3), 1.0);
  EXPECT_DOUBLE_EQ(mcnemar_exact_p(2, 3), 1.0);  // 2 * P(X <= 2 | n=5) = 1
  EXPECT_DOUBLE_EQ(binom_test_half(0, 1), 1.0);
  EXPECT_THROW(binom_test_half(4, 3), std::invalid_argument);
}

TEST(Binom, MatchesExactIntegerArithmetic) {
  for (int n = 1; n <= 120; n += (n < 30 ? 1 : 7)) {
    for (int k = 0; k <= n; ++k) {
      const double want = exact_two_sided_half(k, n);
      const double got = binom_test_half(k, n);
      ASSERT_NEAR(got, want, 1e-12 * want + 1e-300) << "k=" << k << " n=" << n;
    }
  }
}

TEST(Binom, LargeNIsFiniteAndMonotone) {
  double prev = 0.0;
  for (uint64_t k = 0; k <= 50000; k += 500) {
    const double p = binom_test_half(k, 100000);
    ASSERT_TRUE(std::isfinite(p));
    ASSERT_GE(p, prev);
    prev = p;
  }
  EXPECT_DOUBLE_EQ(binom_test_half(50000, 100000), 1.0);
}

TEST(McNemar, CountsPairs) {
  const std::vector<char> a_{1, 1, 0, 0, 1, 1, 1, 0};
  const std::vector<char> b_{1, 0, 1, 0, 0, 0, 1, 0};
  bool a[8], b[8];
  for (int i = 0; i < 8; ++i) a[i] = a_[i], b[i] = b_[i];
  const auto r = mcnemar_exact(a, b);
  EXPECT_EQ(r.both, 2u);
  EXPECT_EQ(r.only_a, 3u);
  EXPECT_EQ(r.only_b, 1u);
  EXPECT_EQ(r.neither, 2u);
  EXPECT_DOUBLE_EQ(r.p_value, 2.0 * 5.0 / 16.0);  // n=4, k=1: 2*(1+4)/16
  EXPECT_THROW(mcnemar_exact(std::span<const bool>(a, 8), std::span<const bool>(b, 7)), std::invalid_argument);
}

TEST(SignFlip, HandValues) {
  const std::vector<double> d{1.0, 2.0, 3.0};  // sums +-1+-2+-3: |S| >= 6 in 2 of 8
  const auto r = sign_flip_test(d);
  EXPECT_TRUE(r.exact);
  EXPECT_EQ(r.resamples, 8u);
  EXPECT_DOUBLE_EQ(r.p_value, 0.25);
  EXPECT_DOUBLE_EQ(r.mean, 2.0);
  EXPECT_EQ(r.n_pos, 3);
  // All zero: every assignment ties -> p = 1.
  EXPECT_DOUBLE_EQ(sign_flip_test(std::vector<double>{0.0, 0.0}).p_value, 1.0);
  // One value: two assignments, both |S| equal.
  EXPECT_DOUBLE_EQ(sign_flip_test(std::vector<double>{-0.3}).p_value, 1.0);
  // Decimal values whose sums round differently in different orders still tie.
  const std::vector<double> dec{0.1, 0.2, 0.3, -0.6};  // obs = 0 up to rounding
  EXPECT_DOUBLE_EQ(sign_flip_test(dec).p_value, 1.0);
}

TEST(SignFlip, ExactMatchesBruteForce) {
  Rng rng(7);
  for (int n = 1; n <= 16; ++n) {
    std::vector<int> di(n);
    std::vector<double> dd(n);
    for (int i = 0; i < n; ++i) {
      di[i] = static_cast<int>(rng.below(9)) - 3;  // skewed positive
      dd[i] = di[i];
    }
    const auto r = sign_flip_test(dd);
    ASSERT_TRUE(r.exact);
    ASSERT_DOUBLE_EQ(r.p_value, brute_sign_flip_int(di)) << "n=" << n;
  }
}

TEST(SignFlip, MonteCarloAgreesWithExactAndIsSeeded) {
  Rng rng(11);
  std::vector<int> di(22);
  std::vector<double> dd(22);
  for (int i = 0; i < 22; ++i) {
    di[i] = static_cast<int>(rng.below(11)) - 4;
    dd[i] = di[i];
  }
  const double exact = sign_flip_test(dd, 0, 0, 22).p_value;
  ASSERT_DOUBLE_EQ(exact, brute_sign_flip_int(di));
  const uint64_t R = 40000;
  const auto mc = sign_flip_test(dd, 123, R);
  EXPECT_FALSE(mc.exact);
  EXPECT_EQ(mc.resamples, R);
  const double sd = std::sqrt(exact * (1 - exact) / R);
  EXPECT_NEAR(mc.p_value, exact, 5 * sd + 2.0 / R);
  EXPECT_EQ(sign_flip_test(dd, 123, R).p_value, mc.p_value);  // same seed, same answer
  EXPECT_GT(mc.p_value, 0.0);                                  // MC p-value never 0
}

TEST(SignFlip, RejectsBadInput) {
  EXPECT_THROW(sign_flip_test(std::vector<double>{}), std::invalid_argument);
  EXPECT_THROW(sign_flip_test(std::vector<double>{1.0, INFINITY}), std::invalid_argument);
  EXPECT_THROW(sign_flip_test(std::vector<double>{1.0}, 0, 10, 25), std::invalid_argument);
}

TEST(Rng, DeterministicAndUniform) {
  Rng a(42), b(42), c(43);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.next();
    EXPECT_EQ(x, b.next());
    differs |= x != c.next();
  }
  EXPECT_TRUE(differs);
  // below(6): each face within 5 sigma of n/6 over 60000 draws.
  Rng r(1);
  int counts[6] = {};
  for (int i = 0; i < 60000; ++i) ++counts[r.below(6)];
  for (int c6 : counts) EXPECT_NEAR(c6, 10000, 5 * std::sqrt(60000 * (1.0 / 6) * (5.0 / 6)));
  for (int i = 0; i < 1000; ++i) {
    const double u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(Bootstrap, FixedResamplesGiveHandPercentiles) {
  const std::vector<double> x{1.0, 2.0, 3.0, 10.0};
  // Five resamples with means 1, 2, 4, 5.5, 10 (sorted).
  const std::vector<std::vector<uint32_t>> idx{{3, 3, 3, 3}, {0, 0, 0, 0}, {0, 1, 2, 3}, {1, 1, 1, 1}, {0, 1, 2, 2}};
  // means: 10, 1, 4, 2, 2.25
  auto mean = [&](std::span<const uint32_t> ii) {
    double s = 0;
    for (auto i : ii) s += x[i];
    return s / ii.size();
  };
  const auto ci = bootstrap_interval(4, mean, idx, 0.5);  // 25th and 75th percentiles
  // sorted means {1, 2, 2.25, 4, 10}: p25 at h=1 -> 2; p75 at h=3 -> 4
  EXPECT_DOUBLE_EQ(ci.estimate, 4.0);
  EXPECT_DOUBLE_EQ(ci.lo, 2.0);
  EXPECT_DOUBLE_EQ(ci.hi, 4.0);
  EXPECT_THROW(bootstrap_interval(4, mean, idx, 1.0), std::invalid_argument);
  EXPECT_THROW(bootstrap_interval(4, mean, {}, 0.9), std::invalid_argument);
}

TEST(Bootstrap, SeededMeanCiCoversAndShrinks) {
  Rng rng(5);
  std::vector<double> small(20), large(2000);
  for (auto& v : small) v = rng.uniform();
  for (auto& v : large) v = rng.uniform();
  const auto a = bootstrap_mean_ci(small, 0.95, 2000, 9);
  const auto b = bootstrap_mean_ci(small, 0.95, 2000, 9);
  EXPECT_EQ(a.lo, b.lo);
  EXPECT_EQ(a.hi, b.hi);
  EXPECT_LT(a.lo, a.estimate);
  EXPECT_GT(a.hi, a.estimate);
  const auto c = bootstrap_mean_ci(large, 0.95, 2000, 9);
  // Width scales like 1/sqrt(n): 2 * 1.96 * sqrt(1/12 / n).
  EXPECT_NEAR(c.hi - c.lo, 2 * 1.96 * std::sqrt(1.0 / 12 / 2000), 0.15 * (c.hi - c.lo));
  EXPECT_NEAR(c.estimate, 0.5, 0.03);
  EXPECT_THROW(bootstrap_indices(0, 10, 1), std::invalid_argument);
}
