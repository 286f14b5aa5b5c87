#!/usr/bin/env bash
# GPU machine: the Hopper wgmma prefill kernel (issue 14), prefill v4
# (docs/cuda.md "Prefill v4"). The default is now wslc (run L, 2026-12-01):
# wslp (wsl, bf16 with ping-pong) whose fp8 producer converts with
# constant-offset addressing. wsk / wskp (K converted ahead of V, 14% slower
# for fp8 in run N_L) were removed in the ninth session.
# Builds test_cuda + bench_attention only, then: the 8K causal bench (bf16 /
# e4m3 / e5m2 caches) for wsl, wslp, wslc, then wsl, wslp, wslc again
# (drift control), PyTorch SDPA in the same run, the wgmma building-block
# tests, the prefill correctness tests under the default (unset
# FP8KV_WGMMA_CFG; with FP8KV_WGMMA_GRID=7, so that every CTA walks many work
# items, and on the full grid) and wslc (both grids), an Nsight Compute
# profile (one launch of the e4m3 kernel under wsl and wslc; text under
# $OUT/ncu), then the prefill tests under wsl, ws, wsf and mma.sync
# while the budget allows (each skipped one is reported); the SASS spill
# check; a short table.
#   run(command="bash scripts/gpu_prefill.sh", carry=[".debs"])
# Budget: <= 200 s with the build (run K1 of 2026-12-01's eighth session:
# 182 s). Each test gets at most what is left of BUDGET. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fp8kv-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
BUDGET=${BUDGET:-185}
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
for cfg in wsl wslp wslc wsl wslp wslc; do
  FP8KV_WGMMA_CFG=$cfg timeout 20 $BENCH prefill-wgmma 2>&1 | grep '"prefill"' | tee -a "$OUT/bench.jsonl"
done
phase sdpa
timeout 30 python3 tools/bench_sdpa.py --prefill-only 2>&1 | tee "$OUT/sdpa.jsonl"
runtest wgmma_blocks 'CudaWgmma.*' 20
P='Kernels/CudaPrefill.*/wgmma'
# The default (wslc) first, with a 7-CTA grid (many items per CTA) and on
# the full grid; then the candidate wslc (both grids).
runtest def_grid7 "$P" 60 FP8KV_WGMMA_GRID=7
runtest def "$P" 60
runtest wslc_grid7 "$P" 60 FP8KV_WGMMA_CFG=wslc FP8KV_WGMMA_GRID=7
runtest wslc "$P" 60 FP8KV_WGMMA_CFG=wslc
# Nsight Compute: one launch of prefill_ws_kernel with the e4m3 cache (bench
# order: bf16 launches 1-23, e4m3 24-46: the 27th), the sections that say
# where the time goes (SOL, pipes, shared memory, scheduler, warp states,
# per-SASS stall samples). Text under $OUT/ncu; the top stall PCs printed.
NCUB=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
ncu_prof() {  # cfg
  local left=$(( BUDGET - $(el) ))
  [ $left -gt 50 ] && left=50
  if [ -z "$NCUB" ] || [ $left -lt 25 ]; then RES[ncu_$1]="skipped"; echo "== ncu $1 skipped ($(el) s)"; return; fi
  phase "ncu $1 (limit $left s)"
  mkdir -p "$OUT/ncu"
  FP8KV_WGMMA_CFG=$1 timeout $left $NCUB --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section SourceCounters \
    --section LaunchStats --section Occupancy -k regex:prefill_ws --launch-skip 26 --launch-count 1 -f \
    -o /tmp/ncu_$1 $BENCH prefill-wgmma >"$OUT/ncu/run_$1.log" 2>&1
  local rc=$?
  RES[ncu_$1]="rc=$rc"
  [ -f /tmp/ncu_$1.ncu-rep ] || { tail -5 "$OUT/ncu/run_$1.log"; return; }
  $NCUB -i /tmp/ncu_$1.ncu-rep --page details --print-details all >"$OUT/ncu/details_$1.txt" 2>&1
  $NCUB -i /tmp/ncu_$1.ncu-rep --page source --csv --print-source sass >"$OUT/ncu/sass_$1.csv" 2>&1
  grep -E "^ +(Duration|Issue Slots Busy|No Eligible|Eligible Warps|Registers Per|Warp Cycles Per Issued|SM: Pipe (Tensor|Shared|Alu|Fma) Cycles|L1: Data Pipe Lsu|L1: Data Bank|Stall (Long|Wait|Barrier|Short|MIO|Math|GMMA|Not Sel))" \
    "$OUT/ncu/details_$1.txt" | sed -E 's/ +/ /g' | head -24 | tee "$OUT/ncu/summary_$1.txt"
  python3 - "$OUT/ncu/sass_$1.csv" <<'PY' | tee "$OUT/ncu/top_$1.txt"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
if hdr is None: sys.exit(print("no SASS table"))
h = rows[hdr]; si = h.index("Warp Stall Sampling (All Samples)"); src = h.index("Source")
body = [r for r in rows[hdr + 1:] if len(r) > si and r[si].replace(",", "").isdigit()]
tot = sum(int(r[si].replace(",", "")) for r in body) or 1
print(f"stall samples {tot}; top PCs (index, %, SASS):")
top = sorted(range(len(body)), key=lambda i: -int(body[i][si].replace(",", "")))[:14]
for i in top:
    print(f"{i:5d} {100 * int(body[i][si].replace(',', '')) / tot:5.1f}% {body[i][src].strip()[:80]}")
PY
  gzip -f "$OUT/ncu/sass_$1.csv"
}
ncu_prof wsl
ncu_prof wslc
runtest wsl "$P" 60 FP8KV_WGMMA_CFG=wsl
runtest ws "$P" 60 FP8KV_WGMMA_CFG=ws
runtest wsf "$P" 60 FP8KV_WGMMA_CFG=wsf
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
echo "tests: wgmma blocks ${RES[wgmma_blocks]}; prefill/wgmma default(wslc, grid 7) ${RES[def_grid7]}; default ${RES[def]}; wslc(grid 7) ${RES[wslc_grid7]}; wslc ${RES[wslc]}; wsl ${RES[wsl]}; ws ${RES[ws]}; wsf ${RES[wsf]}; prefill/mma ${RES[mma]}; SASS no-spill $spill; ncu wsl ${RES[ncu_wsl]} wslc ${RES[ncu_wslc]}"
phase done
