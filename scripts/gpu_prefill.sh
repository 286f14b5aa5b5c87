#!/usr/bin/env bash
# GPU machine: the Hopper wgmma prefill kernel (issue 14), prefill v3; wsl is
# the default since run K1 (the bench names each config explicitly)
# (docs/cuda.md "Prefill v3"). Builds test_cuda + bench_attention only, then:
# the 8K causal bench (bf16 / e4m3 / e5m2 caches) for the default ws and the
# new configurations wsf and wsl (ws again at the end: drift control), PyTorch
# SDPA in the same run, the wgmma building-block tests, the prefill
# correctness tests under ws (its code moved into the shared item loop) and
# each new configuration (wsl twice: with FP8KV_WGMMA_GRID=7, so that every
# CTA walks many work items, and on the full grid), then the mma.sync prefill
# tests (shared epilogue), each while the budget allows; the SASS spill
# check; a short table.
#   run(command="bash scripts/gpu_prefill.sh", carry=[".debs"])
# Budget: <= 180 s with the build (run I: build 41 s, one config's prefill
# tests ~40 s). Each test gets at most what is left of the budget.
# Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fp8kv-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
BUDGET=${BUDGET:-172}
el() { echo $(( $(date +%s) - T0 )); }
phase() { echo "== $1 ($(el) s)"; }
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/env.txt"
phase build
source scripts/gpu_kernel_build.sh
declare -A RES
# runtest name filter max_timeout_s [env...]: skipped when under 20 s are left.
runtest() {
  local name=$1 filter=$2 tmax=$3; shift 3
  local left=$(( BUDGET - $(el) ))
  [ $left -gt $tmax ] && left=$tmax
  if [ $left -lt 20 ]; then RES[$name]="skipped(budget)"; echo "== test $name skipped ($(el) s)"; return; fi
  phase "test $name ($* limit ${left} s)"
  env "$@" timeout $left $TEST --gtest_filter="$filter" >"$OUT/test_$name.log" 2>&1
  local rc=$?
  grep -E "^\[  (PASSED|FAILED) |worst|mismatches|Failure|gpu .* cpu|batched != single|error" "$OUT/test_$name.log" | head -14
  RES[$name]=$([ $rc = 0 ] && echo PASS || echo "FAIL(rc=$rc)")
}
phase bench
: >"$OUT/bench.jsonl"
for cfg in ws wsf wsl ws; do
  FP8KV_WGMMA_CFG=$cfg timeout 20 $BENCH prefill-wgmma 2>&1 | grep '"prefill"' | tee -a "$OUT/bench.jsonl"
done
phase sdpa
timeout 30 python3 tools/bench_sdpa.py --prefill-only 2>&1 | tee "$OUT/sdpa.jsonl"
runtest wgmma_blocks 'CudaWgmma.*' 20
P='Kernels/CudaPrefill.*/wgmma'
# ws first: the default's code moved into the item loop shared with wsl.
runtest ws "$P" 60 FP8KV_WGMMA_CFG=ws
runtest wsl_grid7 "$P" 60 FP8KV_WGMMA_CFG=wsl FP8KV_WGMMA_GRID=7
runtest wsf "$P" 60 FP8KV_WGMMA_CFG=wsf
runtest wsl "$P" 60 FP8KV_WGMMA_CFG=wsl
# mma.sync (head_dim 64/128/256): its epilogue is now the shared helper.
runtest mma 'Kernels/CudaPrefill.*/mma' 60
phase sass
cuobjdump -sass $BENCH 2>/dev/null | awk '/Function :/ {f=$3; n[f]=0} /HGMMA/ {w[f]++} /LDL|STL/ {l[f]++} END {for (k in n) printf "%s HGMMA=%d LDL/STL=%d\n", k, w[k], l[k]}' | grep -E "prefill" | sed -E 's/^_ZN[^ ]*[0-9]+(prefill_wgmma_kernel|prefill_ws_kernel|prefill_kernel)(I[^ ]*E)?EvN[^ ]*/\1\2/' | sort > "$OUT/sass.txt"
grep -c . "$OUT/sass.txt" | sed 's/^/prefill kernels in SASS: /'
grep -v "LDL/STL=0$" "$OUT/sass.txt"
spill=PASS
grep -vq "LDL/STL=0$" "$OUT/sass.txt" && spill=FAIL
[ -s "$OUT/sass.txt" ] || spill="n/a(no cuobjdump)"
phase table
python3 - "$OUT/bench.jsonl" "$OUT/sdpa.jsonl" <<'PY' | tee "$OUT/table.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
sd = [json.loads(l) for l in open(sys.argv[2]) if l.startswith('{"kind": "sdpa_prefill"')]
sdpa = sd[-1]["TFLOPs"] if sd else None
print("prefill 8K causal, 32 q / 8 kv heads, d128" + (f"; SDPA bf16 {sdpa:.0f} TFLOP/s ({sd[-1]['ms']:.3f} ms)" if sdpa else "; SDPA: n/a"))
print(f"{'cache':10} {'kernel':11} {'ms':>8} {'TFLOP/s':>8} {'x SDPA':>7}")
for r in rows:
    x = f"{r['TFLOPs']/sdpa:.3f}" if sdpa else "-"
    print(f"{r['dtype']:10} {r['kernel']:11} {r['ms']:8.4f} {r['TFLOPs']:8.1f} {x:>7}")
PY
echo "tests: wgmma blocks ${RES[wgmma_blocks]}; prefill/wgmma ws ${RES[ws]}; wsl(grid 7) ${RES[wsl_grid7]}; wsf ${RES[wsf]}; wsl ${RES[wsl]}; prefill/mma ${RES[mma]}; SASS no-spill $spill"
phase done
