#!/usr/bin/env bash
# GPU machine: decode kernels (issue 14, docs/cuda.md "Decode v8"). Builds
# test_cuda + bench_attention (gpu_kernel_build.sh), runs the decode
# correctness tests (CudaDecode.*, CudaPlan.*: within the derived bound,
# batched == single bitwise), then the decode benchmark with every row in a
# fresh process: bench_attention `shape` (copy bandwidth + one decode row per
# process) for bf16 and fp8 e4m3 at D = 128 (Llama-3-8B, 32/8 heads) and
# D = 256 (Gemma-3-12B, 16/8 heads), PyTorch SDPA bf16 on the same rows, each
# in a fresh CUDA context (tools/bench_sdpa.py --decode-fresh), the fp8 D = 256
# cp.async ring rows (FP8KV_DECODE_D256REG=0), the in-process order probe,
# the SASS spill check and a table against the targets at the end.
#   run(command="bash scripts/gpu_decode.sh", carry=[".debs"])
# Budget: <= 200 s including the build; optional phases (ring rows, probe)
# are skipped when the run is late. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fp8kv-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
phase() { echo "== $1 ($(el) s)"; }
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/env.txt"
nvcc --version | tail -1 | tee -a "$OUT/env.txt"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$OUT/env.txt"
phase build
source scripts/gpu_kernel_build.sh

phase test
timeout 60 $TEST --gtest_filter='CudaDecode.*:CudaPlan.*' --gtest_output=json:"$OUT/test_cuda.json" >"$OUT/test_cuda.log" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q "^\[  PASSED  \]" "$OUT/test_cuda.log" && ! grep -q "^\[  FAILED  \]" "$OUT/test_cuda.log"; then
  echo PASS >"$OUT/test_base.status"
else
  echo FAIL >"$OUT/test_base.status"
fi
echo "decode tests: $(cat "$OUT/test_base.status") (rc $rc)"
grep -E "^\[  (PASSED|FAILED) |worst|FAILED|tests ran" "$OUT/test_cuda.log" | tail -12

# GPU clocks, power and temperatures every 200 ms over the benchmarks.
SMI_PID=
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 200 >"$OUT/smi.csv" 2>/dev/null &
  SMI_PID=$!
fi

# The rows (H HKV D B CTX), each measured in a fresh process / CUDA context.
ROWS=()
for B in 1 8 32 64; do for C in 1024 4096 16384 65536; do ROWS+=("32 8 128 $B $C"); done; done
for B in 1 8 32; do for C in 16384 65536; do ROWS+=("16 8 256 $B $C"); done; done

phase "sdpa (fresh context per row)"
SARGS=(); for r in "${ROWS[@]}"; do SARGS+=("${r// /,}"); done
timeout 75 python3 tools/bench_sdpa.py --decode-fresh "${SARGS[@]}" >"$OUT/sdpa.jsonl" 2>"$OUT/sdpa.err"
rc=$?
echo "sdpa rows: $(grep -c sdpa_decode "$OUT/sdpa.jsonl") of ${#ROWS[@]} (rc $rc)"; tail -2 "$OUT/sdpa.err"

bench_rows() {  # name gate dtypes D-filter B-filter [ENV=VAL ...]
  local name=$1 gate=$2 dts=$3 dsel=$4 bsel=$5; shift 5
  local r dt h hkv d b c n=0
  : >"$OUT/bench_$name.jsonl"
  for dt in $dts; do
    for r in "${ROWS[@]}"; do
      read -r h hkv d b c <<<"$r"
      [[ " $dsel " == *" $d "* && " $bsel " == *" $b "* ]] || continue
      [ $(el) -lt $gate ] || { echo "skip the rest of $name (time, $(el) s)"; return; }
      env "$@" timeout 20 $BENCH shape $dt $d $b $c >>"$OUT/bench_$name.jsonl" 2>>"$OUT/bench_$name.err" ||
        echo "row $name $dt d$d B=$b ctx=$c: rc $?"
      n=$((n + 1))
    done
  done
  echo "$name: $n rows"
}
phase "ours (fresh process per row)"
bench_rows base 185 "bf16 fp8_e4m3" "128 256" "1 8 32 64"
phase "fp8 d256 on the cp.async ring (FP8KV_DECODE_D256REG=0)"
bench_rows d256ring 175 "fp8_e4m3" "256" "1 8 32" FP8KV_DECODE_D256REG=0

# Version 8 variant: the split reduction with 32 columns per CTA
# (FP8KV_DECODE_REDUCE=wide): decode tests under it (all but the 12 s LEAN
# batch test), then the rows with many splits (B = 1 and 8).
if [ $(el) -lt 160 ]; then
  phase "variant wide (FP8KV_DECODE_REDUCE=wide)"
  FP8KV_DECODE_REDUCE=wide timeout 30 $TEST --gtest_filter='CudaDecode.*:-CudaDecode.LeanAutoBatchEqualsSingle' >"$OUT/test_wide.log" 2>&1
  rc=$?
  if [ $rc = 0 ] && grep -q "^\[  PASSED  \]" "$OUT/test_wide.log" && ! grep -q "^\[  FAILED  \]" "$OUT/test_wide.log"; then
    echo PASS >"$OUT/test_wide.status"
  else
    echo FAIL >"$OUT/test_wide.status"
  fi
  echo "decode tests under wide: $(cat "$OUT/test_wide.status") (rc $rc)"
  bench_rows wide 180 "fp8_e4m3 bf16" "128" "1 8" FP8KV_DECODE_REDUCE=wide
fi

# The order effect itself (version 7): bf16 B=64/4K, 32/4K, 64/1K first in a
# fresh process, then after the largest bf16 row (8.6 GB allocated, read,
# freed), in one process.
if [ $(el) -lt 183 ]; then
  phase probe
  timeout 12 $BENCH probe 2>/dev/null | grep -v '"kind":"copy"' >"$OUT/probe.jsonl"
fi
[ -n "$SMI_PID" ] && kill "$SMI_PID" 2>/dev/null

phase sass
cuobjdump -sass $BENCH 2>/dev/null | awk '/Function :/ {f=$3; n[f]=0} /LDL|STL/ {l[f]++} END {for (k in n) printf "%s LDL/STL=%d\n", k, l[k]}' |
  grep -E "decode_kernel|decode_reduce" | sed -E 's/^_ZN.*_cu_[0-9a-f]+[0-9][0-9](decode_)/\1/; s/EEvN[^ ]*//' |
  sort >"$OUT/sass.txt"
if [ ! -s "$OUT/sass.txt" ]; then echo "SASS CHECK: no decode kernels found" | tee -a "$OUT/sass.txt"
elif grep -vq "LDL/STL=0$" "$OUT/sass.txt"; then grep -v "LDL/STL=0$" "$OUT/sass.txt"; echo "SASS CHECK: FAIL (local memory above)"
else echo "SASS CHECK: ok (no LDL/STL in $(wc -l <"$OUT/sass.txt") decode kernels)"; fi

phase table
python3 tools/decode_table.py "$OUT" | tee "$OUT/table.txt"
phase done
