#!/usr/bin/env bash
# GPU machine: decode-kernel variants side by side (issue 14, docs/cuda.md
# versions 6-7). Builds test_cuda + bench_attention (gpu_cuda.sh's recipe),
# runs the decode/store/plan tests, the PyTorch SDPA peer, a bf16 probe in a
# fresh process, then for every variant (an environment string read by
# decode_attention.cu) the decode tests (correctness + batched == single
# bitwise) and the d128 decode benchmark (+ the d256 rows for the variants in
# D256_VARIANTS), the plan / split sweeps, SASS spill check, and a table.
#   run(command="bash scripts/gpu_decode.sh", carry=[".debs"])
# Budget: <= 5 minutes including the build; later phases are skipped when
# earlier ones ran long (NCU=1 adds Nsight Compute profiles, off by default;
# VARIANTS_A / VARIANTS_B="name=ENV ..." replace the lists).
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
# Kernel tests this branch owns (prefill is the kern branch's; gpu_cuda.sh runs it).
timeout 90 $TEST --gtest_filter='CudaDecode.*:CudaStore.*:CudaPlan.*' --gtest_output=json:"$OUT/test_cuda.json" 2>&1 |
  tee "$OUT/test_cuda.log" | grep -E "^\[  (PASSED|FAILED) |worst|FAILED|thread|seed" | tail -20

phase sdpa
timeout 45 python3 tools/bench_sdpa.py >"$OUT/sdpa.jsonl" 2>&1; tail -1 "$OUT/sdpa.jsonl"

# bf16 B=64/4K, 32/4K, 64/1K first in a fresh process, then after the
# largest bf16 row (run G: the same plan ran 12% slower in the decode phase
# than in the plan phase). GPU clocks, power and temperatures sampled every
# 200 ms from here to the end of the variants (smi.csv; phase times above).
SMI_PID=
if command -v nvidia-smi >/dev/null; then
  Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,temperature.memory,clocks_event_reasons.active
  nvidia-smi --query-gpu=$Q --format=csv -c 1 >/dev/null 2>&1 || Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu
  nvidia-smi --query-gpu=$Q --format=csv -lms 200 >"$OUT/smi.csv" 2>/dev/null &
  SMI_PID=$!
fi
phase probe
timeout 25 $BENCH probe 2>/dev/null | grep -v '"kind":"copy"' >"$OUT/probe.jsonl"
python3 -c '
import json,sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r=json.loads(l); print("  probe %s B=%d ctx=%d: %.1f us (%d splits)"%(r["dtype"],r["batch"],r["ctx"],r["ms"]*1e3,r["splits"]))' "$OUT/probe.jsonl"

# Variants: name=ENV (space-free ENV: several settings joined by ','). base =
# the committed defaults. deepbf16: the DEEP register pipeline for bf16 only;
# pfN: L2 prefetch of each warp's next N tiles; lean: e4m3 d128 with one tile
# in registers, <= 128 registers (4 CTAs/SM), L2 prefetch 2 (or PF) ahead;
# pf2pair: the prefetch as one bulk request per row for the KV-head pair.
# Group A (most promising) before the profiles, group B after them; a variant
# is skipped when the run is past the group's time gate.
# Version 7: fused = the split reduction in the decode kernel's last CTA;
# hpw = heads per warp (a CTA reads 4 adjacent KV heads' rows); hpwfused =
# both.
# d256ring = fp8 D=256 on the cp.async ring (the default before version 7's
# register path; d256 rows only). Run H measured fused, hpw and hpwfused
# slower than base (docs/cuda.md version 7): they stay off, runnable here.
VARIANTS_A=${VARIANTS_A:-"base= d256ring=FP8KV_DECODE_D256REG=0 hpw=FP8KV_DECODE_HPW=1 fused=FP8KV_DECODE_FUSED=1"}
VARIANTS_B=${VARIANTS_B:-""}
D256_VARIANTS=${D256_VARIANTS:-"base d256ring"}
D256_ONLY=${D256_ONLY:-"d256ring"}  # variants that change only D=256 kernels: no d128 rows
NAMES=()
run_variants() {  # gate_seconds variant...
  local gate=$1; shift
  local v name envs ev rc
  for v in "$@"; do
    name=${v%%=*}; envs=${v#*=}
    [ $(el) -lt $gate ] || { echo "skip variant $name (time)"; continue; }
    phase "variant $name ($envs)"
    NAMES+=("$name")
    ev=(); IFS=',' read -ra ev <<<"$envs"
    env "${ev[@]}" timeout 60 $TEST --gtest_filter='CudaDecode.*' >"$OUT/test_$name.log" 2>&1
    rc=$?
    if [ $rc = 0 ] && grep -q "^\[  PASSED  \]" "$OUT/test_$name.log" && ! grep -q "^\[  FAILED  \]" "$OUT/test_$name.log"; then
      echo PASS >"$OUT/test_$name.status"
    else
      echo FAIL >"$OUT/test_$name.status"
    fi
    echo "decode tests: $(cat "$OUT/test_$name.status") (rc $rc); $(grep -E "worst" "$OUT/test_$name.log" | paste -sd' ')"
    : >"$OUT/bench_$name.jsonl"
    [[ " $D256_ONLY " == *" $name "* ]] ||
      env "${ev[@]}" timeout 45 $BENCH decode128 >"$OUT/bench_$name.jsonl" 2>"$OUT/bench_$name.err"
    if [[ " $D256_VARIANTS " == *" $name "* ]] && [ $(el) -lt $((gate + 20)) ]; then
      env "${ev[@]}" timeout 30 $BENCH decode256 2>>"$OUT/bench_$name.err" | grep -v '"kind":"copy"' >>"$OUT/bench_$name.jsonl"
    fi
  done
}
run_variants 200 $VARIANTS_A
[ -n "$SMI_PID" ] && kill "$SMI_PID" 2>/dev/null

# Nsight Compute on the problem shapes (--clock-control none: leave the
# clocks alone), base and a version 7 variant (NCU=1 only).
NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ "${NCU:-0}" != 0 ] && [ -n "$NCU_BIN" ]; then
  phase "ncu ($NCU_BIN)"
  NCU_METRICS=(--metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio')
  for job in "fp8_e4m3 128 32 16384:base=" "fp8_e4m3 128 32 16384:hpw=FP8KV_DECODE_HPW=1" \
             "fp8_e4m3 128 1 65536:base=" "fp8_e4m3 128 1 65536:fused=FP8KV_DECODE_FUSED=1" \
             "bf16 128 32 4096:base=" "bf16 128 32 4096:hpw=FP8KV_DECODE_HPW=1"; do
      shape=${job%%:*}; v=${job#*:}
      [ $(el) -lt 195 ] || { echo "skip ncu $shape $v (time)"; continue; }
      name=${v%%=*}; envs=${v#*=}; ev=(); IFS=',' read -ra ev <<<"$envs"
      tag=$(echo "$shape" | awk '{printf "%s_b%s_c%s", ($1=="bf16"?"bf16":"fp8"), $3, $4}')_$name
      ncu_run() {
        env "${ev[@]}" timeout 25 "$NCU_BIN" --clock-control none -k regex:decode_kernel --launch-skip 3 --launch-count 1 \
          --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
          --section LaunchStats "${NCU_METRICS[@]}" $BENCH shape $shape >"$OUT/ncu_$tag.txt" 2>&1
      }
      if ! ncu_run && [ ${#NCU_METRICS[@]} -gt 0 ]; then
        echo "ncu $tag failed with the stall metrics (tail: $(tail -2 "$OUT/ncu_$tag.txt" | paste -sd' ')); without them from now on"
        NCU_METRICS=()
        ncu_run || echo "ncu $tag: rc $? (tail: $(tail -2 "$OUT/ncu_$tag.txt" | paste -sd' '))"
      fi
      grep -E "^\s*(Duration|DRAM Throughput|Achieved Occupancy) " "$OUT/ncu_$tag.txt" | head -3 | sed "s/^/  $tag: /"
  done
else
  echo "ncu: not run (NCU=${NCU:-1}, binary '${NCU_BIN}')"
fi

run_variants 220 $VARIANTS_B

if [ $(el) -lt 240 ]; then
  phase "plans + splits"
  FP8KV_BENCH_CTAS=2,3,4 timeout 15 $BENCH plans 2>/dev/null | grep -v '"kind":"copy"' >"$OUT/plans.jsonl"
  [ $(el) -lt 252 ] && timeout 18 $BENCH splits 2>/dev/null | grep -v '"kind":"copy"' >>"$OUT/plans.jsonl"
  # The same forced splits with the fused reduction ('fN' in the table).
  [ $(el) -lt 262 ] && FP8KV_DECODE_FUSED=1 timeout 18 $BENCH splits 2>/dev/null | grep -v '"kind":"copy"' |
    sed 's/"kind":"split"/"kind":"split_fused"/' >>"$OUT/plans.jsonl"
fi

phase sass
cuobjdump -sass $BENCH 2>/dev/null | awk '/Function :/ {f=$3; n[f]=0} /HMMA/ {h[f]++} /LDL|STL/ {l[f]++} /CCTL|PREFETCH|CCTLL/ {q[f]++} END {for (k in n) printf "%s HMMA=%d PREF=%d LDL/STL=%d\n", k, h[k], q[k], l[k]}' |
  grep -E "decode_kernel|store_kernel" | sed -E 's/^_ZN[^ ]*[0-9]+(decode_kernel|store_kernel)(ILi([0-9]+)E(Li([0-9]+)E)?(Lb([01])E)?(Lb([01])E)?)?[^ ]*/\1<\3,\5,\7\9>/' | sort >"$OUT/sass.txt"
cat "$OUT/sass.txt"
if grep -vq "LDL/STL=0$" "$OUT/sass.txt"; then echo "SASS CHECK: FAIL (local memory above)"; else echo "SASS CHECK: ok (no LDL/STL)"; fi

phase table
python3 tools/decode_variants.py "$OUT" "${NAMES[@]}" | tee "$OUT/table.txt"
if [ -s "$OUT/plans.jsonl" ]; then
  echo "base kernel: plan at assumed CTAs per SM 'cN: us (splits)'; forced split sizes 'sN: us' ('fN': fused reduction)" | tee -a "$OUT/table.txt"
  python3 -c '
import json,sys,collections
g=collections.defaultdict(list)
for l in open(sys.argv[1]):
    if l.startswith("{"):
        try: r=json.loads(l)
        except ValueError: continue
        k=(r["dtype"],r["d"],r["batch"],r["ctx"])
        if r["kind"]=="plan": g[k].append("c%d:%.1f(%d)"%(r["ctas_per_sm"],r["ms"]*1e3,r["splits"]))
        elif r["kind"]=="split": g[k].append("s%d:%.1f"%(r["split_tokens"],r["ms"]*1e3))
        elif r["kind"]=="split_fused": g[k].append("f%d:%.1f"%(r["split_tokens"],r["ms"]*1e3))
for k,v in g.items(): print("  %s d%d B=%d ctx=%d: "%k+" ".join(v))' "$OUT/plans.jsonl" | tee -a "$OUT/table.txt"
fi
if [ -s "$OUT/smi.csv" ]; then
  python3 - "$OUT/smi.csv" <<'PY' | tee -a "$OUT/table.txt"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr, data = [h.strip() for h in rows[0]], [r for r in rows[1:] if len(r) == len(rows[0])]
num = lambda v: float(v.strip().split()[0]) if v.strip() and v.strip().split()[0].replace(".", "").isdigit() else None
out = []
for i, h in enumerate(hdr[1:], 1):
    vals = [x for x in (num(r[i]) for r in data) if x is not None]
    if vals:
        out.append(f"{h} {min(vals):g}-{max(vals):g}")
reasons = sorted({r[-1].strip() for r in data}) if "event" in hdr[-1] else []
print(f"nvidia-smi over {len(data)} samples: " + "; ".join(out) + (f"; event reasons {reasons}" if reasons else ""))
PY
fi
grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/test_cuda.log"
phase done
