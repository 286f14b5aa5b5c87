#!/usr/bin/env bash
# GPU machine (repo root): the batch-1 decode step (docs/cuda_backend.md
# "Batch-1 step (2026-12-01)"). Builds fp8kv + test_cuda_ops, runs
# test_cuda_ops (CUDA graph replay == eager bitwise, the GPU goldens), then
# `fp8kv bench latency` at batch 1 on the Llama-3.1-8B shape (dummy weights,
# fp8 cache, CUDA graphs) at 1K and 60K context with FP8KV_STEP_PROFILE set:
# the backend prints, per replayed step, the device time of the graph, of the
# logits/sample tail and the device idle time between steps, and the per-op
# event times of one eager copy of a decode step (stderr -> $OUT/*.log).
# If the budget allows, Nsight Compute (ncu) then times every kernel of one
# eager decode step (cudaProfilerStart/Stop bracket it). A table at the end.
#   run(command="ln -sfn ../../.debs .debs; bash scripts/gpu_step.sh", carry=[".debs"])
# (The eighth session's fused GEMV epilogues, routes norm= / prep=, were
# measured slower in K2, N_L and O_1 and deleted in the ninth.)
# Ninth session (2026-12-01, step9): the tests that cover the decode GEMV,
# norm and prep kernels first (TESTS_FILTER), then the 1K and 60K rows (and,
# with B32=1, batch 32 at 16K with fp8 and bf16 caches) with
# same-process route sets (the variants of docs/cuda_backend.md "Batch-1
# variants (ninth session)" were measured in run O_2 and deleted). The
# table at the end has one row per route
# set with its ms/step and tok/s and the change against the mean of the
# process's default runs.
# Budget: BUDGET_S (default 200 s, build included); a case that would start
# with less than its estimate left is skipped (in the order below: the b32
# rows, then ncu, go first). NO_TESTS=1 skips the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET_S=${BUDGET_S:-200}
source scripts/gpu_engine_build.sh fp8kv test_cuda_ops

if [ -z "${NO_TESTS:-}" ] && [ -x $BUILD/tests/test_cuda_ops ]; then
  phase tests
  # The tests of the decode GEMV, norm, prep and route kernels and the
  # engine-level graph == eager checks.
  TESTS_FILTER=${TESTS_FILTER:-'CudaOps.Linear*:CudaOps.Gemv*:CudaOps.RmsNorm*:CudaOps.QkvPrep*:CudaGraphs.*'}
  timeout 90 $BUILD/tests/test_cuda_ops --gtest_filter="$TESTS_FILTER" 2>&1 | tee "$OUT/test_cuda_ops.log" |
    grep -E "^\[  (FAILED|PASSED) |\[ graphs \]|tests ran|Failure|Expected|Which is" | head -40
fi

MODEL=tests/data/configs/llama-3.1-8b
L1K="latency --batch-size 1 --input-len 1024 --output-len 64 --num-iters-warmup 1 --num-iters 2"
# In the 1K and 60K processes after their main run (default routes), one
# model load, ~1 s (1K) / ~4 s (60K) per route set: the default again (1K
# twice, 60K once), so the table shows the run-to-run spread in one process.
# Ninth session: the pre= / slab= variants were measured in run O_2 (none
# faster, slab=3 +27 %) and deleted; docs/cuda_backend.md "Batch-1 variants
# (ninth session)". A new variant goes in as ";$DEF_ROUTES,key=value".
DEF_ROUTES="qkv=simtk,o_proj=simtk,gate_up=auto,down=simt8,lm_head=auto"
ROUTE_SETS="$DEF_ROUTES;$DEF_ROUTES"
ROUTE_SETS_60K="$DEF_ROUTES"
# 60K and b32 run one warm-up iteration (ninth session, the lead's note of
# 22:45): without it the timed iteration's first decode step is the eager
# step that captures the CUDA graph, which decode tok/s counts (run O_1's
# 60K: 174.6 tok/s against 180.1 from its median step); each route set's
# run re-captures in its own warm-up iteration too (one more 60K prefill
# each, ~4 s). The variant table also gives 1000 / median ms per step.
# (Main captures the decode graphs at engine load since 5c9c29b, so the
# warm-up iteration is belt and braces there.)
# name | estimated seconds | environment | bench arguments. FP8KV_STEP_PROFILE=20:
# the op-timed eager copy is made at the 20th replayed step (in the warm-up
# iteration, so the timed iterations do not contain it). 60K: 1000 = no
# op-timed copy there (run K2's copy at step 10 cost its decode tok/s ~3%),
# the per-step times only.
# Batch 32 at 16K (~35-40 s load, ~25 s prefill of 512K tokens each, B32=1):
# the op-timed copy (step 100) lands in the warm-up iteration's decode.
LB32="latency --batch-size 32 --input-len 16384 --output-len 128 --num-iters-warmup 1 --num-iters 1"
# Estimates: the 8B dummy load (~1 s: device-side dummy weights, the
# default; ~12 s with FP8KV_DUMMY_DEVICE=0) plus the run.
LD=$([ "${FP8KV_DUMMY_DEVICE:-1}" = 0 ] && echo 12 || echo 2)
CASES=(
  "lat_b1_1k_fp8|$((LD + 15))|FP8KV_STEP_PROFILE=20|$L1K --kv-cache-dtype fp8 --gemv-routes $ROUTE_SETS"
  "lat_b1_60k_fp8|$((LD + 25))|FP8KV_STEP_PROFILE=1000|latency --batch-size 1 --input-len 60000 --output-len 32 --num-iters-warmup 1 --num-iters 1 --kv-cache-dtype fp8 --gemv-routes $ROUTE_SETS_60K"
)
[ -n "${B32:-}" ] && CASES+=(
  "lat_b32_16k_fp8|$((LD + 55))|FP8KV_STEP_PROFILE=100|$LB32 --kv-cache-dtype fp8"
  "lat_b32_16k_bf16|$((LD + 65))|FP8KV_STEP_PROFILE=100|$LB32 --kv-cache-dtype bf16"
)
phase bench
for c in "${CASES[@]}"; do
  IFS='|' read -r name est envs args <<<"$c"
  l=$(left)
  if [ "$l" -lt "$est" ]; then echo "$name: skipped: budget ($l s left, needs ~$est s)" | tee "$OUT/$name.skipped"; continue; fi
  t=$(date +%s)
  # shellcheck disable=SC2086
  timeout $(( l > 10 ? l - 5 : 5 )) env $envs $FP8KV bench $args $MODEL --load-format dummy --ignore-eos --backend cuda \
    --json >"$OUT/$name.json" 2>"$OUT/$name.log"
  rc=$?
  echo "$name: rc $rc, $(( $(date +%s) - t )) s"
  [ $rc -ne 0 ] && tail -5 "$OUT/$name.log"
done

# Per-kernel durations of one eager decode step under ncu (kernels serialized,
# caches and clocks left alone): only if ~55 s remain. NCU_ROUTES (default:
# the default routes) picks the routes of that step.
NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU_BIN" ] && [ "$(left)" -ge 55 ]; then
  phase "ncu ($NCU_BIN)"
  l=$(left)
  FP8KV_GEMV_ROUTES="${NCU_ROUTES:-$DEF_ROUTES}" FP8KV_STEP_PROFILE=5 timeout $(( l - 3 )) "$NCU_BIN" --profile-from-start off --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --csv --page raw \
    $FP8KV bench latency --batch-size 1 --input-len 1024 --output-len 12 --num-iters-warmup 0 --num-iters 1 \
    --kv-cache-dtype fp8 $MODEL --load-format dummy --ignore-eos --backend cuda >"$OUT/ncu_b1_1k.csv" 2>"$OUT/ncu_b1_1k.log"
  echo "ncu: rc $?"
else
  echo "ncu: skipped (${NCU_BIN:-no ncu}; $(left) s left)"
fi

phase table
python3 - "$OUT" <<'EOF'
import csv, collections, glob, json, os, re, sys
out = sys.argv[1]
print(f"{'case':16} {'ms/step':>8} {'tok/s':>7} {'floor':>6} {'copy GB/s':>9} {'GB/step':>8}")
NAMES = ("lat_b1_1k_fp8", "lat_b1_60k_fp8", "lat_b32_16k_fp8", "lat_b32_16k_bf16")
res = {}
for n in NAMES:
    try:
        j = json.load(open(os.path.join(out, n + ".json")))
    except Exception:
        print(f"{n:16} (no result)")
        continue
    res[n] = j
    print(f"{n:16} {j.get('decode_ms_per_step', 0):8.3f} {j.get('decode_tokens_per_s', 0):7.1f} "
          f"{j.get('floor_fraction', 0):6.3f} {j.get('copy_gbps', 0):9.0f} {j.get('bytes_per_step', 0) / 1e9:8.2f}")
if "lat_b32_16k_fp8" in res and "lat_b32_16k_bf16" in res:
    a, b = res["lat_b32_16k_fp8"], res["lat_b32_16k_bf16"]
    print(f"b32 16K fp8/bf16 decode tok/s ratio {a.get('decode_tokens_per_s', 0) / max(b.get('decode_tokens_per_s', 0), 1e-9):.3f} (target 1.5)")
for n in ("lat_b1_1k_fp8", "lat_b1_60k_fp8"):
    if n not in res:
        continue
    j = res[n]
    print(f"route sets, {n} (same process; main run {j.get('gemv_routes')}: {j.get('decode_ms_per_step', 0):.3f} ms/step)")
    for r in j.get("gemv_route_runs", []):
        print(f"  {r['routes']:82} {r['decode_ms_per_step']:7.3f} ms/step {r['decode_tokens_per_s']:6.1f} tok/s floor {r['floor_fraction']:.3f}")
# The variant table: every route set of the batch-1 processes (the main run
# = the default routes), ms/step, tok/s, and the change against the mean of
# that process's default-route runs (negative = faster).
DEF = "qkv=simtk,o_proj=simtk,gate_up=auto,down=simt8,lm_head=auto,store=fused,act=fused"
for n in ("lat_b1_1k_fp8", "lat_b1_60k_fp8"):
    if n not in res:
        continue
    j = res[n]
    runs = [{"routes": j.get("gemv_routes", "?"), "decode_ms_per_step": j.get("decode_ms_per_step", 0),
             "decode_tokens_per_s": j.get("decode_tokens_per_s", 0)}] + j.get("gemv_route_runs", [])
    base = [r["decode_ms_per_step"] for r in runs if r["routes"] == DEF and r["decode_ms_per_step"] > 0]
    b = sum(base) / len(base) if base else 0.0
    print(f"== variants {n}: default mean {b:.3f} ms/step over {len(base)} runs")
    for r in runs:
        name = r["routes"].replace(DEF, "DEFAULT")
        d = (r["decode_ms_per_step"] / b - 1) * 100 if b else 0.0
        ms = r["decode_ms_per_step"]
        print(f"  {name:40} {ms:7.3f} ms/step {1e3 / ms if ms else 0:6.1f} tok/s (median step) "
              f"{r['decode_tokens_per_s']:6.1f} tok/s (bench) {d:+6.2f}%")
for n in NAMES:
    p = os.path.join(out, n + ".log")
    if not os.path.exists(p):
        continue
    lines = [l.rstrip() for l in open(p) if l.startswith("step profile")]
    tl = [l for l in lines if l.startswith("step profile:") and "replayed steps" in l]  # one per route set
    ops = [l for l in lines if l.startswith("step profile op:")]
    hdr = [l for l in lines if "op-timed" in l]
    print(f"== {n}")
    for l in (tl + hdr[:1] + ops[:16]):
        print("  " + l)
# ncu: one eager decode step's kernels.
p = os.path.join(out, "ncu_b1_1k.csv")
if os.path.exists(p):
    rows = []
    with open(p, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rd = csv.reader(lines)
    hdr = next(rd, None)
    if hdr and "Kernel Name" in hdr and "gpu__time_duration.sum" in hdr:
        ki, ti = hdr.index("Kernel Name"), hdr.index("gpu__time_duration.sum")
        unit = None
        per = collections.defaultdict(lambda: [0.0, 0])
        for r in rd:
            try:
                v = float(r[ti].replace(",", ""))
            except (ValueError, IndexError):
                unit = r[ti] if len(r) > ti else unit
                continue
            name = re.sub(r"\(.*", "", r[ki]).replace("void ", "")[:70]
            per[name][0] += v
            per[name][1] += 1
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1e-3)
        tot = sum(v for v, _ in per.values()) * scale
        print(f"== ncu: one eager decode step, {sum(c for _, c in per.values())} kernels, {tot:.1f} us "
              f"(unit {unit}; kernels serialized)")
        for name, (v, c) in sorted(per.items(), key=lambda kv: -kv[1][0])[:16]:
            print(f"  {name:70} {v * scale:8.1f} us {c:4d} calls {v * scale / c:7.2f} us/call")
    else:
        print("ncu csv: no kernel rows")
EOF
phase done
