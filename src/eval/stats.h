// Statistics for paired evaluation: percentiles, exact McNemar, sign-flip
// (permutation) test, seeded bootstrap confidence intervals.
//
// Conventions follow numpy/scipy so results can be checked against them
// (tools/gen_stats_goldens.py writes the references):
//  - percentile(): numpy's default "linear" method (Hyndman-Fan type 7).
//  - mcnemar_exact_p(): scipy.stats.binomtest(min(b, c), b + c, 0.5).pvalue.
//  - sign_flip_test(): scipy.stats.permutation_test((d,), np.mean,
//    permutation_type='samples', alternative='two-sided') (exact when
//    n <= exact_max_n; Monte Carlo p = (1 + hits) / (1 + resamples) beyond).
//  - bootstrap: percentile intervals of a statistic over resamples drawn by
//    our own seeded generator (portable; std distributions are not).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace fp8kv::eval {

// Small portable PRNG (xoshiro256**, seeded through splitmix64): the same
// seed gives the same stream on every platform and compiler.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  // Uniform integer in [0, n), n > 0 (rejection sampling, unbiased).
  uint64_t below(uint64_t n);
  // Uniform double in [0, 1) with 53 random bits.
  double uniform();

 private:
  uint64_t s_[4];
};

// q in [0, 100]. Throws std::invalid_argument on an empty input, q out of
// range or a non-finite value.
double percentile(std::vector<double> values, double q);
// Same on already sorted (ascending) values.
double percentile_sorted(std::span<const double> sorted, double q);

// Exact two-sided binomial test of k successes in n trials against p = 0.5
// (probabilities of outcomes at most as likely as k, summed; capped at 1).
// n == 0 gives 1.
double binom_test_half(uint64_t k, uint64_t n);

// Exact McNemar test: only_a = pairs where only A was correct, only_b the
// reverse; the two-sided binomial test on the discordant pairs.
double mcnemar_exact_p(uint64_t only_a, uint64_t only_b);

struct McNemar {
  uint64_t both = 0, only_a = 0, only_b = 0, neither = 0;
  double p_value = 1.0;
};
// Paired outcomes (same items, same order). Throws on a size mismatch.
McNemar mcnemar_exact(std::span<const bool> a, std::span<const bool> b);

struct SignFlip {
  double p_value = 1.0;
  bool exact = true;
  uint64_t resamples = 0;  // assignments enumerated or drawn
  double mean = 0.0;       // mean of d
  int n_pos = 0, n_neg = 0, n_zero = 0;
};
// Two-sided sign-flip test that the paired differences d are symmetric about
// zero, statistic mean(d). Exact enumeration of all 2^n sign assignments when
// n <= exact_max_n (<= 24), else `mc_resamples` seeded random assignments.
// Ties are counted with a relative tolerance (as scipy does) so that equal
// statistics reached through different summation orders count as equal.
// Throws std::invalid_argument on an empty input or non-finite values.
SignFlip sign_flip_test(std::span<const double> d, uint64_t seed = 0, uint64_t mc_resamples = 100000,
                        int exact_max_n = 20);

struct Interval {
  double estimate = 0.0;  // statistic on the original sample
  double lo = 0.0, hi = 0.0;
};

using Statistic = std::function<double(std::span<const uint32_t> idx)>;

// Draws `resamples` bootstrap resamples of n indices (with replacement).
std::vector<std::vector<uint32_t>> bootstrap_indices(uint32_t n, int resamples, uint64_t seed);

// Percentile bootstrap interval at `level` (e.g. 0.95) of a statistic that
// reads the sample through an index list (so clustered and ratio statistics
// work the same way), over the given resamples. The bounds are the
// (1-level)/2 and (1+level)/2 percentiles (numpy linear) of the resampled
// statistics. Non-finite resampled statistics are an error.
Interval bootstrap_interval(uint32_t n, const Statistic& stat, const std::vector<std::vector<uint32_t>>& resamples,
                            double level);

// Convenience: CI of the mean of x with freshly drawn seeded resamples.
Interval bootstrap_mean_ci(std::span<const double> x, double level, int resamples, uint64_t seed);

}  // namespace fp8kv::eval
