#!/usr/bin/env bash
# GPU machine: build the CUDA targets, run test_cuda, the kernel benchmarks
# and the PyTorch SDPA peer, print a summary table. Logs/JSON go to $OUT.
#   run(command="bash scripts/gpu_cuda.sh", carry=[".debs"])
# Optional:
#   PREBUILT=dir   test_cuda + bench_attention built elsewhere (used if they run here)
#   BASE_BENCH=f   a bench_attention of the previous kernels: its decode and store
#                  figures go into the table's "base" columns (same run, same card)
#   FP8KV_BENCH_CTAS=2,3,4,6  CTAs per SM the auto decode plan assumes in the
#                  "plans" sweep (the default plan asks the occupancy API)
# The SASS check fails the run (exit 3) if a decode/prefill/store kernel uses
# local memory (LDL/STL), per instantiation. Budget: <= 4 minutes with the
# build (test 100 s, bench 120 s, SDPA 60 s at most; the DEEP-variant test and
# bench only when under 170 s by then, 60 s each at most).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fp8kv-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
phase() { echo "== $1 ($(( $(date +%s) - T0 )) s)"; }
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/env.txt"
nvcc --version | tail -1 | tee -a "$OUT/env.txt"
phase build
BASE_BENCH=${BASE_BENCH:-}
source scripts/gpu_kernel_build.sh  # (PREBUILT: see there)
ls -la $TEST $BENCH || exit 1
phase test
timeout 100 $TEST --gtest_output=json:"$OUT/test_cuda.json" 2>&1 | tee "$OUT/test_cuda.log" | grep -vE "^\[ (RUN|       OK) " | tail -40
if [ -n "$BASE_BENCH" ]; then
  phase bench-base
  : >"$OUT/base.jsonl"
  for what in store decode; do "$BASE_BENCH" $what 2>&1 | grep -v '"kind":"copy"' >>"$OUT/base.jsonl"; done
  tail -3 "$OUT/base.jsonl"
fi
phase bench
export FP8KV_BENCH_CTAS=${FP8KV_BENCH_CTAS:-2,3,4,6}
timeout 120 $BENCH 2>&1 | tee "$OUT/bench.jsonl"
phase sdpa
timeout 60 python3 tools/bench_sdpa.py 2>&1 | tee "$OUT/sdpa.jsonl"
# The DEEP decode variant (d128: one more tile in flight, 2 CTAs/SM): its
# correctness (decode tests) and its d128 decode figures, when time allows.
DEEP_COLS=()
if [ -z "$BASE_BENCH" ] && [ $(( $(date +%s) - T0 )) -lt 170 ]; then
  phase deep
  FP8KV_DECODE_DEEP=1 timeout 60 $TEST --gtest_filter='CudaDecode.*' 2>&1 | tee "$OUT/test_deep.log" | grep -E "^\[  (PASSED|FAILED) |worst" | tail -8
  FP8KV_DECODE_DEEP=1 timeout 60 $BENCH decode128 2>&1 | grep -v '"kind":"copy"' >"$OUT/deep.jsonl"
  DEEP_COLS=("$OUT/deep.jsonl" deep)
fi
phase sass
cuobjdump --dump-resource-usage $BENCH 2>/dev/null | grep -E "decode_kernel|prefill" -A1 | grep -oE "(REG|STACK|SHARED|LOCAL):[0-9]+|Function [^ ]+" | paste -sd' ' | head -c 3000 > "$OUT/resources.txt"
cuobjdump -sass $BENCH 2>/dev/null | awk '/Function :/ {f=$3; n[f]=0} /HMMA/ {h[f]++} /LDG\.[A-Z0-9_.]*128/ {g[f]++} /LDGSTS/ {a[f]++} /LDL|STL/ {l[f]++} END {for (k in n) printf "%s HMMA=%d LDG128=%d LDGSTS=%d LDL/STL=%d\n", k, h[k], g[k], a[k], l[k]}' | grep -E "decode|prefill|store_kernel" | sed -E 's/^_ZN[^ ]*[0-9]+(decode_reduce_kernel|decode_kernel|prefill_kernel|store_kernel)(ILi([0-9]+)E(Li([0-9]+)E)?(Lb([01])E)?)?[^ ]*/\1<\3,\5,\7>/' | sort > "$OUT/sass.txt"
cat "$OUT/sass.txt"
spill=0
if grep -vq "LDL/STL=0$" "$OUT/sass.txt"; then spill=1; echo "SASS CHECK: FAIL (local memory in the kernels above)"; else echo "SASS CHECK: ok (no LDL/STL)"; fi
phase table
python3 tools/bench_sdpa.py --table "$OUT/bench.jsonl" "$OUT/sdpa.jsonl" ${BASE_BENCH:+"$OUT/base.jsonl"} "${DEEP_COLS[@]}" | tee "$OUT/table.txt"
grep -E "^\[  (PASSED|FAILED) |tests ran|worst" "$OUT/test_cuda.log"
phase done
[ $spill = 0 ] || exit 3
