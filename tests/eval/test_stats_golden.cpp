// src/eval/stats against scipy/numpy references written by
// tools/gen_stats_goldens.py into tests/golden/stats/ (skips while missing).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>

#include "../common/golden.h"
#include "eval/stats.h"

using namespace fp8kv::eval;
using nlohmann::json;

namespace {
bool load_golden(const std::string& name, json& out) {
  const auto path = std::filesystem::path(FP8KV_SOURCE_DIR) / "tests" / "golden" / "stats" / name;
  if (!fp8kv::test_util::find_golden(path)) return false;
  out = json::parse(fp8kv::test_util::read_golden(path));
  return true;
}
#define LOAD_OR_SKIP(name, j)                                                                    \
  json j;                                                                                        \
  if (!load_golden(name, j)) {                                                                   \
    GTEST_SKIP() << "tests/golden/stats/" name " missing: run python3 "                          \
                    "tools/gen_stats_goldens.py on a machine with numpy and scipy";              \
  }
}  // namespace

TEST(StatsGolden, BinomMatchesScipy) {
  LOAD_OR_SKIP("binom.json", g);
  ASSERT_FALSE(g["cases"].empty());
  for (const auto& c : g["cases"]) {
    const uint64_t k = c["k"], n = c["n"];
    const double want = c["p"];
    EXPECT_NEAR(binom_test_half(k, n), want, 1e-11 * want + 1e-300) << "k=" << k << " n=" << n;
    if (c.contains("only_a")) {
      EXPECT_NEAR(mcnemar_exact_p(c["only_a"].get<uint64_t>(), c["only_b"].get<uint64_t>()), want, 1e-11 * want);
    }
  }
}

TEST(StatsGolden, PercentileMatchesNumpy) {
  LOAD_OR_SKIP("percentile.json", g);
  ASSERT_FALSE(g["cases"].empty());
  for (const auto& c : g["cases"]) {
    const auto v = c["values"].get<std::vector<double>>();
    const double q = c["q"], want = c["value"];
    EXPECT_NEAR(percentile(v, q), want, 1e-13 * (1 + std::fabs(want))) << "n=" << v.size() << " q=" << q;
  }
}

TEST(StatsGolden, SignFlipMatchesScipyPermutationTest) {
  LOAD_OR_SKIP("sign_flip.json", g);
  ASSERT_FALSE(g["cases"].empty());
  for (const auto& c : g["cases"]) {
    const auto d = c["d"].get<std::vector<double>>();
    const double want = c["p"];
    const auto r = sign_flip_test(d);
    ASSERT_TRUE(r.exact);
    EXPECT_NEAR(r.p_value, want, 1e-12) << "n=" << d.size();
  }
}

TEST(StatsGolden, BootstrapOnFixedResamplesMatchesNumpy) {
  LOAD_OR_SKIP("bootstrap.json", g);
  ASSERT_FALSE(g["cases"].empty());
  for (const auto& c : g["cases"]) {
    const auto x = c["x"].get<std::vector<double>>();
    const auto idx = c["indices"].get<std::vector<std::vector<uint32_t>>>();
    auto mean = [&](std::span<const uint32_t> ii) {
      double s = 0;
      for (auto i : ii) s += x[i];
      return s / static_cast<double>(ii.size());
    };
    const double level = c["level"];
    const auto ci = bootstrap_interval(static_cast<uint32_t>(x.size()), mean, idx, level);
    EXPECT_NEAR(ci.estimate, c["estimate"].get<double>(), 1e-12);
    EXPECT_NEAR(ci.lo, c["lo"].get<double>(), 1e-12);
    EXPECT_NEAR(ci.hi, c["hi"].get<double>(), 1e-12);
    // Our own seeded resampling agrees with scipy's (different random draws)
    // to within the Monte Carlo error of the interval ends.
    const auto own = bootstrap_mean_ci(x, level, 9999, 3);
    const double width = c["scipy_hi"].get<double>() - c["scipy_lo"].get<double>();
    EXPECT_NEAR(own.lo, c["scipy_lo"].get<double>(), 0.1 * width);
    EXPECT_NEAR(own.hi, c["scipy_hi"].get<double>(), 0.1 * width);
  }
}
