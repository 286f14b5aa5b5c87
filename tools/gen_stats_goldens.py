#!/usr/bin/env python3
"""Writes scipy/numpy reference values for src/eval/stats (tests/golden/stats/).

Runs on the GPU machine (python3 with numpy and scipy; no network needed):

    python3 tools/gen_stats_goldens.py [--out tests/golden/stats]

Outputs (JSON, each stored NAME.gz by tools/golden_io.py, consumed by
tests/eval/test_stats_golden.cpp):
  binom.json       scipy.stats.binomtest(k, n, 0.5).pvalue (== exact McNemar
                   p-value for min(b, c), b + c discordant pairs)
  percentile.json  numpy.percentile(values, q) (default method "linear")
  sign_flip.json   scipy.stats.permutation_test((d,), mean,
                   permutation_type='samples', n_resamples=inf) p-values,
                   cross-checked here against a brute-force enumeration
  bootstrap.json   percentile bootstrap intervals of the mean over FIXED
                   resample index lists (so the C++ side can reproduce them
                   exactly), plus scipy.stats.bootstrap(method='percentile')
                   on the same data for a loose sanity comparison

All inputs are generated from a fixed numpy seed; the script asserts its own
cross-checks and exits non-zero if scipy and the brute force disagree.
"""
import argparse
import itertools
import json
import math
import os
import sys

import numpy as np
import scipy

from golden_io import write_gz
import scipy.stats as st


def binom_cases():
    cases = []
    for n in [0, 1, 2, 5, 10, 11, 20, 25, 40, 50, 100, 101, 250, 1000, 5000]:
        ks = sorted({0, 1, n // 4, n // 3, n // 2, max(0, n // 2 - 1), n - 1, n} & set(range(n + 1)))
        for k in ks:
            p = 1.0 if n == 0 else float(st.binomtest(k, n, 0.5).pvalue)
            cases.append({"k": k, "n": n, "p": p})
    # The seed document's McNemar examples (discordant b / c).
    for b, c in [(82, 106), (109, 133), (342, 360), (35, 36), (3, 10), (92, 81), (119, 117), (332, 360), (2, 1),
                 (91, 86)]:
        cases.append({"k": min(b, c), "n": b + c, "p": float(st.binomtest(min(b, c), b + c, 0.5).pvalue),
                      "only_a": b, "only_b": c})
    return cases


def percentile_cases(rng):
    cases = []
    for n in [1, 2, 3, 7, 10, 101, 1000]:
        vals = rng.normal(size=n) * 3.0
        if n >= 10:
            vals[::5] = np.round(vals[::5])  # some ties
        for q in [0, 1, 10, 25, 50, 75, 90, 99, 99.9, 99.99, 100]:
            cases.append({"values": vals.tolist(), "q": q, "value": float(np.percentile(vals, q))})
    return cases


def brute_sign_flip(d):
    d = np.asarray(d, dtype=np.float64)
    obs = abs(d.sum())
    tol = 8 * len(d) * np.finfo(np.float64).eps * np.abs(d).sum()
    hits = 0
    total = 0
    for signs in itertools.product([1.0, -1.0], repeat=len(d)):
        s = float(np.dot(signs, d))
        hits += abs(s) >= obs - tol
        total += 1
    return min(1.0, hits / total)


def sign_flip_cases(rng):
    cases = []
    specs = [(2, "normal"), (3, "normal"), (5, "int"), (8, "normal"), (10, "shift"), (12, "int"), (14, "shift"),
             (16, "normal"), (6, "zeros")]
    for n, kind in specs:
        if kind == "normal":
            d = rng.normal(size=n)
        elif kind == "shift":
            d = rng.normal(size=n) + 0.8
        elif kind == "int":
            d = rng.integers(-3, 4, size=n).astype(np.float64)
        else:
            d = np.array([0.0, 0.0, 1.0, -1.0, 2.0, 0.5])
        res = st.permutation_test((d,), lambda x, axis: np.mean(x, axis=axis), vectorized=True,
                                  permutation_type='samples', n_resamples=np.inf, alternative='two-sided')
        p_scipy = float(res.pvalue)
        p_brute = brute_sign_flip(d)
        if not math.isclose(p_scipy, p_brute, rel_tol=1e-12, abs_tol=1e-15):
            sys.exit(f"sign-flip cross-check failed for {d.tolist()}: scipy {p_scipy} vs brute {p_brute}")
        cases.append({"d": d.tolist(), "p": p_scipy})
    return cases


def bootstrap_cases(rng):
    cases = []
    for n, B, level in [(5, 50, 0.9), (20, 200, 0.95), (40, 500, 0.95)]:
        x = rng.gamma(2.0, size=n)
        idx = rng.integers(0, n, size=(B, n))
        means = x[idx].mean(axis=1)
        lo = float(np.percentile(means, 100 * (1 - level) / 2))
        hi = float(np.percentile(means, 100 * (1 + level) / 2))
        sp = st.bootstrap((x,), np.mean, confidence_level=level, n_resamples=9999, method='percentile',
                          random_state=np.random.default_rng(1))
        cases.append({"x": x.tolist(), "indices": idx.tolist(), "level": level, "estimate": float(x.mean()),
                      "lo": lo, "hi": hi, "scipy_lo": float(sp.confidence_interval.low),
                      "scipy_hi": float(sp.confidence_interval.high)})
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden",
                                                  "stats"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(20240611)
    meta = {"numpy": np.__version__, "scipy": scipy.__version__, "generator": "tools/gen_stats_goldens.py"}
    outputs = {
        "binom.json": binom_cases(),
        "percentile.json": percentile_cases(rng),
        "sign_flip.json": sign_flip_cases(rng),
        "bootstrap.json": bootstrap_cases(rng),
    }
    for name, cases in outputs.items():
        path = os.path.join(args.out, name + ".gz")
        write_gz(path, json.dumps({"meta": meta, "cases": cases}, indent=1, allow_nan=False) + "\n")
        print(f"wrote {path} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
