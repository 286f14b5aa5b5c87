#!/usr/bin/env bash
# GPU machine: the Hopper wgmma prefill kernel (issue 14). Builds test_cuda +
# bench_attention, runs the wgmma building-block tests, the prefill tests under
# both kernels (each in its own process: a fault in one does not hide the
# other), benchmarks 8K causal prefill for both kernels and PyTorch SDPA,
# checks the SASS (no local memory, HGMMA present), prints a short table.
#   run(command="bash scripts/gpu_prefill.sh", carry=[".debs"])
# Budget: <= 4 minutes with the build. Order: build, building blocks, wgmma
# prefill tests (default config), bench (mma, wgmma configs), SDPA, then the
# tuning configs' and mma.sync's prefill tests while under the budget (each
# skipped one is reported), SASS, table. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fp8kv-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
phase() { echo "== $1 ($(( $(date +%s) - T0 )) s)"; }
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/env.txt"
phase build
source scripts/gpu_kernel_build.sh
declare -A RES
runtest() {  # name filter timeout_s
  phase "test $1"
  timeout $3 $TEST --gtest_filter="$2" >"$OUT/test_$1.log" 2>&1
  local rc=$?
  grep -E "^\[  (PASSED|FAILED) |worst|Failure|gpu .* cpu|batched != single|error|DIAG|wrong" "$OUT/test_$1.log" | head -14
  RES[$1]=$([ $rc = 0 ] && echo PASS || echo "FAIL(rc=$rc)")
}
runtest wgmma_blocks 'CudaWgmma.*' 30
runtest prefill_wgmma 'Kernels/CudaPrefill.*/wgmma' 60
if [ "${RES[prefill_wgmma]}" != PASS ] || [ "${RES[wgmma_blocks]}" != PASS ]; then
  phase memcheck
  timeout 40 compute-sanitizer --tool memcheck $TEST --gtest_filter='CudaWgmma.*:Kernels/CudaPrefill.LongPromptsBatchedEqualsSingle/wgmma' \
    >"$OUT/memcheck.log" 2>&1
  grep -E "ERROR SUMMARY|Invalid|Error|at 0x" "$OUT/memcheck.log" | head -12
fi
phase bench
: >"$OUT/bench.jsonl"
timeout 30 $BENCH prefill-mma 2>&1 | grep '"prefill"' | tee -a "$OUT/bench.jsonl"
timeout 30 $BENCH prefill-wgmma 2>&1 | grep '"prefill"' | tee -a "$OUT/bench.jsonl"
for cfg in 64x2d 64x2p 64x1 128x2; do
  FP8KV_WGMMA_CFG=$cfg timeout 30 $BENCH prefill-wgmma 2>&1 | grep '"prefill"' | tee -a "$OUT/bench.jsonl"
done
phase sdpa
timeout 40 python3 tools/bench_sdpa.py --prefill-only 2>&1 | tee "$OUT/sdpa.jsonl"
# The tuning configurations (FP8KV_WGMMA_CFG: keys per tile x warpgroups per
# CTA, p = pipelined) and the mma.sync kernel's prefill tests, while the
# 4-minute budget allows (each skipped one says so).
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
for cfg in 64x2d 64x2p; do
  RES[prefill_wgmma_$cfg]=skipped
  left 175 && FP8KV_WGMMA_CFG=$cfg runtest prefill_wgmma_$cfg 'Kernels/CudaPrefill.*/wgmma' 50
done
RES[prefill_mma]=skipped
left 185 && runtest prefill_mma 'Kernels/CudaPrefill.*/mma' $(( 235 - ($(date +%s) - T0) ))
phase sass
cuobjdump -sass $BENCH 2>/dev/null | awk '/Function :/ {f=$3; n[f]=0} /HMMA/ {h[f]++} /HGMMA/ {w[f]++} /LDGSTS/ {a[f]++} /LDL|STL/ {l[f]++} END {for (k in n) printf "%s HMMA=%d HGMMA=%d LDGSTS=%d LDL/STL=%d\n", k, h[k], w[k], a[k], l[k]}' | grep -E "prefill" | sed -E 's/^_ZN[^ ]*[0-9]+(prefill_wgmma_kernel|prefill_kernel)(ILi([0-9]+)E(Li([0-9]+)E)?(Li([0-9]+)E)?)?[^ ]*/\1<\3,\5,\7>/' | sort > "$OUT/sass.txt"
cat "$OUT/sass.txt"
cuobjdump --dump-resource-usage $BENCH 2>/dev/null | grep -A1 "prefill_wgmma" | grep -oE "REG:[0-9]+|SHARED:[0-9]+|LOCAL:[0-9]+" | paste -sd' ' | tee "$OUT/resources.txt"
spill=PASS
grep -vq "LDL/STL=0$" "$OUT/sass.txt" && spill=FAIL
phase table
python3 - "$OUT/bench.jsonl" "$OUT/sdpa.jsonl" <<'PY' | tee "$OUT/table.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
sd = [json.loads(l) for l in open(sys.argv[2]) if l.startswith('{"kind": "sdpa_prefill"')]
sdpa = sd[-1]["TFLOPs"] if sd else None
print("prefill 8K causal, 32 q / 8 kv heads, d128" + (f"; SDPA bf16 {sdpa:.0f} TFLOP/s ({sd[-1]['ms']:.3f} ms)" if sdpa else "; SDPA: n/a"))
print(f"{'cache':10} {'kernel':11} {'ms':>8} {'TFLOP/s':>8} {'x SDPA':>7}")
for r in rows:
    x = f"{r['TFLOPs']/sdpa:.2f}" if sdpa else "-"
    print(f"{r['dtype']:10} {r['kernel']:11} {r['ms']:8.3f} {r['TFLOPs']:8.1f} {x:>7}")
PY
echo "tests: wgmma building blocks ${RES[wgmma_blocks]}; prefill/mma ${RES[prefill_mma]}; prefill/wgmma ${RES[prefill_wgmma]}; wgmma 64x2d ${RES[prefill_wgmma_64x2d]}; 64x2p ${RES[prefill_wgmma_64x2p]}; SASS no-spill $spill"
phase done
