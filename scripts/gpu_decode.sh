#!/usr/bin/env bash
# GPU machine: decode kernels (issue 14, docs/cuda.md "Decode v10"). Builds
# test_cuda + bench_attention (gpu_kernel_build.sh). In the order of what
# matters: decode correctness tests (CudaDecode.*, CudaPlan.*: within the
# derived bound, batched == single bitwise, the fused merge bitwise equal to
# the reduce kernel) under the default; A/B rows (default vs each ALT
# variant, interleaved, one fresh process per row) at the targets' sizes,
# plus forced-split rows; the decode tests under each ALT variant; Nsight
# Compute (decode kernel and reduce kernel of the default, the fused kernel,
# at B=32/16K and B=1/64K); PyTorch SDPA bf16 on every table row, each in a
# fresh CUDA context (tools/bench_sdpa.py --decode-fresh); our rows
# (bench_attention `shape`, one process per row; bf16 and fp8 e4m3 at
# D = 128, Llama-3-8B 32/8 heads, and D = 256, Gemma-3-12B 16/8 heads); the
# SASS spill check, SASS dumps and opcode histograms; a table against the
# targets. SRCJOBS: source-level profiles (below). PREBUILT=DIR: carried
# binaries instead of a build (scripts/gpu_kernel_build.sh).
#   run(command="bash scripts/gpu_decode.sh", carry=[".debs"])
# ALT: space-separated NAME:VAR=VALUE (a bare NAME:VALUE means
# FP8KV_DECODE_V9=VALUE, the eighth session's form). Default: the fused merge.
# Budget: <= 200 s after the build; later phases are cut when the run is
# late. Logs under $OUT.
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
# The runner's FP8KV_GIT_COMMIT when set: the device copy's .git can lag the tree.
{ [ -n "${FP8KV_GIT_COMMIT:-}" ] && echo "commit $FP8KV_GIT_COMMIT (FP8KV_GIT_COMMIT)" || git log -1 --format='commit %h %s' 2>/dev/null; } |
  tee -a "$OUT/env.txt"
phase build
source scripts/gpu_kernel_build.sh

# ALT: the A/B variant list (NAME:VAR=VALUE; NAME:VALUE = FP8KV_DECODE_V9=VALUE).
# Default (after the ninth session's final run): pdl = FP8KV_DECODE_PDL=1, the
# decode kernel launched with programmatic serialization (off by default: the
# engine's batch-1 1K step was 0.8% slower with it);
# Run O_2's list was "fuse:FP8KV_DECODE_FUSE=1 fusepf:FP8KV_DECODE_FUSE=1,FP8KV_DECODE_PF=2"
# (fusepf: the fused merge plus the L2 prefetch 2 tiles ahead, on the B=1
# and B=8/16K rows only).
# fuse again (its counters reworked after O_2: one atomicAdd per CTA).
# Runs P_1 / P_2 of the tenth session had plan = FP8KV_DECODE_PLAN=list (a
# list-scheduling split planner, removed after them: docs/cuda.md "Decode
# v11") and pf3 = FP8KV_DECODE_PF=3 (the L2 prefetch 3 tiles ahead).
ALT=${ALT:-"pdl:FP8KV_DECODE_PDL=1 fuse:FP8KV_DECODE_FUSE=1"}
altenv() {  # the VAR=VALUE words of an ALT entry (commas separate several)
  local v=${1#*:}
  [[ $v == *=* ]] && echo "${v//,/ }" || echo "FP8KV_DECODE_V9=$v"
}
altrow() {  # whether ALT entry $1 runs row $2
  # d256*: a D = 256 variant (e.g. decode v12's FP8KV_DECODE_PF runs), those rows only.
  [[ ${1%%:*} == d256* ]] && { [[ $2 == *" 256 "* ]]; return; }
  [[ ${1%%:*} != fusepf ]] && return 0
  [[ $2 == "fp8_e4m3 128 1 "* || $2 == "fp8_e4m3 128 8 16384"* ]]
}
phase test
# A fixed seed: every test process draws the same cases, so the per-launch
# output hashes ("decode-hash" lines) compare across the variants' processes.
export FP8KV_SEED=${FP8KV_SEED:-20261201}
timeout 75 $TEST --gtest_filter='CudaDecode.*:CudaPlan.*' --gtest_output=json:"$OUT/test_cuda.json" >"$OUT/test_cuda.log" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q "^\[  PASSED  \]" "$OUT/test_cuda.log" && ! grep -q "^\[  FAILED  \]" "$OUT/test_cuda.log"; then
  echo PASS >"$OUT/test_base.status"
else
  echo FAIL >"$OUT/test_base.status"
fi
echo "decode tests: $(cat "$OUT/test_base.status") (rc $rc)"
grep -E "^\[  (PASSED|FAILED) |worst|FAILED|tests ran|fused merge" "$OUT/test_cuda.log" | tail -12

# GPU clocks, power and temperatures every 200 ms over the benchmarks.
SMI_PID=
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 200 >"$OUT/smi.csv" 2>/dev/null &
  SMI_PID=$!
fi

# A/B rows: the targets' rows (fp8 d128 B=8/32/64 at 16K and 64K, B=1 at 64K
# and 1K; fp8 d256 B=32 at 16K and 64K; bf16 d128 B=32/16K, B=1/64K), and
# fp8 d128 B=64 at 4K and 1K (decode v13: F4 auto's largest gains, measured
# only in the table so far); the default and each ALT variant interleaved per
# row, each in a fresh process.
phase "A/B rows (default vs $ALT)"
: >"$OUT/bench_ab_base.jsonl"
for a in $ALT; do : >"$OUT/bench_ab_${a%%:*}.jsonl"; done
# ABROWS=d256: the fp8 d256 rows first (decode v12), then the d128 ones.
ROWS_D128=("fp8_e4m3 128 32 16384" "fp8_e4m3 128 8 16384" "fp8_e4m3 128 1 65536" "fp8_e4m3 128 64 16384"
           "fp8_e4m3 256 32 16384" "fp8_e4m3 128 8 65536" "fp8_e4m3 128 1 1024" "fp8_e4m3 128 32 65536"
           "bf16 128 32 16384" "bf16 128 1 65536" "fp8_e4m3 256 32 65536" "fp8_e4m3 128 64 65536"
           "fp8_e4m3 128 64 4096" "fp8_e4m3 128 64 1024")
ROWS_D256=("fp8_e4m3 256 32 16384" "fp8_e4m3 256 8 16384" "fp8_e4m3 256 1 65536" "fp8_e4m3 256 32 65536"
           "fp8_e4m3 256 64 16384" "fp8_e4m3 256 8 65536" "fp8_e4m3 256 1 1024" "fp8_e4m3 256 1 16384"
           "fp8_e4m3 128 32 16384" "fp8_e4m3 128 8 16384" "fp8_e4m3 128 1 65536")
if [ "${ABROWS:-}" = d256 ]; then ROWS=("${ROWS_D256[@]}"); else ROWS=("${ROWS_D128[@]}"); fi
for job in "${ROWS[@]}"; do
  [ $(el) -lt 110 ] || { echo "A/B: stop at $job (time, $(el) s)"; break; }
  timeout 10 $BENCH shape $job >>"$OUT/bench_ab_base.jsonl" 2>>"$OUT/bench_ab.err" || echo "row ab base $job: rc $?"
  for a in $ALT; do
    n=${a%%:*}; altrow "$a" "$job" || continue
    env $(altenv "$a") timeout 10 $BENCH shape $job >>"$OUT/bench_ab_$n.jsonl" 2>>"$OUT/bench_ab.err" || echo "row ab $n $job: rc $?"
  done
done
# Forced splits (the plan under the fused merge, docs/cuda.md "Decode v10"):
# fp8 d128 B=32/16K at 2 and 4 splits (auto: 3), B=8/16K at 4 and 8 (auto:
# 6), B=1/64K at 32 and 64 (auto: 49), fp8 d256 B=32/16K at 2 (auto: 1);
# default and each ALT, interleaved.
# (Measured in run O_2, the auto plan best everywhere: only with SPLITS=1.)
[ "${SPLITS:-0}" = 1 ] && phase "forced-split rows"
: >"$OUT/bench_split_base.jsonl"
for a in $ALT; do : >"$OUT/bench_split_${a%%:*}.jsonl"; done
# Decode v11 (tenth session): the rows where the stream method has us behind
# SDPA, at fewer splits than the wave model's (its constants were fitted to
# the first method): fp8 d128 B=1/1K at 128 / 256 (auto 64), B=8/16K at 4096 /
# 8192 (auto 2752), B=1/16K at 1024 / 2048 (auto 384); bf16 d128 B=1/1K at 256.
# (Run O_2's list: B=32/16K at 8192 / 4096, B=8/16K at 4096 / 2048, B=1/64K at
# 2048 / 1024, d256 B=32/16K at 8192.)
for job in "fp8_e4m3 128 1 1024 128" "fp8_e4m3 128 1 1024 256" "fp8_e4m3 128 8 16384 4096" \
           "fp8_e4m3 128 8 16384 8192" "fp8_e4m3 128 1 16384 1024" "fp8_e4m3 128 1 16384 2048" \
           "bf16 128 1 1024 256"; do
  [ "${SPLITS:-0}" = 1 ] || break
  [ $(el) -lt 120 ] || { echo "splits: stop at $job (time, $(el) s)"; break; }
  timeout 10 $BENCH shape $job >>"$OUT/bench_split_base.jsonl" 2>>"$OUT/bench_ab.err" || echo "row split base $job: rc $?"
  for a in $ALT; do
    n=${a%%:*}; altrow "$a" "$job" || continue
    env $(altenv "$a") timeout 10 $BENCH shape $job >>"$OUT/bench_split_$n.jsonl" 2>>"$OUT/bench_ab.err" || echo "row split $n $job: rc $?"
  done
done

# Decode tests (all but the 12 s LEAN batch test) under TESTALT: no PDL, the
# fused merge, and `all` (FP8KV_DECODE_V9=all: the FAST kernels for e5m2 and D = 64
# too, decode v10), each compared launch by launch with the default's output
# hashes (where the default runs the version-8 kernels, e5m2 and D = 64, this
# is FAST == version 8 bitwise). fusepf only adds L2 prefetches (same
# arithmetic): not re-tested.
# (fuse: its in-process test FusedMergeEqualsReduceKernel runs in the default
# run; run O_2 also ran the whole suite under it: TESTALT="... fuse:FP8KV_DECODE_FUSE=1".)
# (`all` was bitwise = default in all 144 launches in run O_2; add
# "all:FP8KV_DECODE_V9=all" to TESTALT to repeat it: ~28 s.)
TESTALT=${TESTALT:-"pdl:FP8KV_DECODE_PDL=1 fuse:FP8KV_DECODE_FUSE=1"}
[ "$TESTALT" = - ] && TESTALT=""  # "-": no decode tests under variants
for a in $TESTALT; do
  fname=${a%%:*}; fenv=$(altenv "$a")
  [ $(el) -lt 125 ] || { echo "skip decode tests under $fname (time)"; continue; }
  phase "decode tests under $fname ($fenv)"
  env $fenv timeout 40 $TEST --gtest_filter='CudaDecode.*:-CudaDecode.LeanAutoBatchEqualsSingle' >"$OUT/test_$fname.log" 2>&1
  rc=$?
  if [ $rc = 0 ] && grep -q "^\[  PASSED  \]" "$OUT/test_$fname.log" && ! grep -q "^\[  FAILED  \]" "$OUT/test_$fname.log"; then
    echo PASS >"$OUT/test_$fname.status"; else echo FAIL >"$OUT/test_$fname.status"; fi
  # Bitwise: every launch's output hash under the variant equals the default
  # run's for the same case (same seed; sorted: one test runs threads).
  grep "^decode-hash" "$OUT/test_cuda.log" | sort >"$OUT/hash_base.txt"
  grep "^decode-hash" "$OUT/test_$fname.log" | sort >"$OUT/hash_$fname.txt"
  # Only launches with the default's plan compare (the line's fields but the
  # hash): a variant with another occupancy (decode v12's d256 C3, removed) plans
  # other splits for some auto-plan cases, which round differently.
  read -r nh nd no < <(awk 'NR == FNR { full[$0]++; k = $0; sub(/ [0-9a-f]+$/, "", k); key[k] = 1; next }
    { k = $0; sub(/ [0-9a-f]+$/, "", k)
      if (k in key) { c++; if (full[$0] > 0) full[$0]--; else d++ } else o++ }
    END { print c + 0, d + 0, o + 0 }' "$OUT/hash_base.txt" "$OUT/hash_$fname.txt")
  if [ "$nh" -gt 0 ] && [ "$nd" = 0 ]; then hs="outputs bitwise = default in all $nh launches with its plan"
  else hs="outputs differ from default in $nd of $nh launches with its plan"; fi
  [ "$no" = 0 ] || hs="$hs ($no launches with another plan, not compared)"
  echo "$(cat "$OUT/test_$fname.status"), $hs" >"$OUT/test_$fname.status"
  echo "decode tests under $fname: $(cat "$OUT/test_$fname.status") (rc $rc)"
  grep -E "^\[  FAILED  \]|worst" "$OUT/test_$fname.log" | tail -5
done

# Nsight Compute, one launch each (--clock-control none: the clocks as in the
# bench), every kernel of one call (regex decode_: the decode kernel and, in
# the default, the reduce kernel after it): the fused kernel at fp8 d128
# B=1/64K and B=32/16K (run O_2 has the default's there), the default at B=1/1K.
NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
first=${ALT%% *}
if [ "${NCU:-1}" != 0 ] && [ -n "$NCU_BIN" ]; then
  phase "ncu ($NCU_BIN)"
  # (The kernels do not change under pdl.)
  jobs_=("fp8_e4m3 128 1 65536:fuse:FP8KV_DECODE_FUSE=1" "fp8_e4m3 128 32 16384:fuse:FP8KV_DECODE_FUSE=1"
         "fp8_e4m3 128 1 1024:base:FP8KV_DECODE_FUSE=0")
  # NCUJOBS: another list, entries "SHAPE:NAME:VAR=VALUE" separated by ';',
  # '+' for the spaces in SHAPE (e.g. fp8_e4m3+256+32+16384:pf2:FP8KV_DECODE_PF=2).
  # NCUEXTRA: more metrics, comma-separated (e.g. the L2's: lts__t_requests.sum).
  [ -n "${NCUJOBS:-}" ] && IFS=';' read -ra jobs_ <<<"${NCUJOBS//+/ }"
  for job in "${jobs_[@]}"; do
    shape=${job%%:*}; rest=${job#*:}; name=${rest%%:*}; ev=${rest#*:}
    [ $(el) -lt 150 ] || { echo "skip ncu $shape $name (time)"; continue; }
    tag=$(echo "$shape" | awk '{printf "%s_d%s_b%s_c%s", ($1=="bf16"?"bf16":"fp8"), $2, $3, $4}')_$name
    # 3 warm-up calls, then the kernels of one call (2 when there is a reduce kernel).
    # SHAPE "read": bench_attention's read-only streaming kernel instead (its 4th launch).
    kre=decode_ skip=6 cnt=2 args="shape $shape"
    [ "$shape" = read ] && { kre=read_kernel skip=3 cnt=1 args=read tag=read_$name; }
    env FP8KV_BENCH_WARMUP_MS=0 $ev timeout 15 "$NCU_BIN" --clock-control none -k regex:$kre \
      --launch-skip $skip --launch-count $cnt --section SpeedOfLight --section WarpStateStats \
      --section SchedulerStats --section Occupancy --section LaunchStats \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,dram__bytes_read.sum${NCUEXTRA:+,$NCUEXTRA}" \
      $BENCH $args >"$OUT/ncu_$tag.txt" 2>&1 || echo "ncu $tag: rc $?"
    grep -E "^  [a-z_:0-9<>, ]*(decode_|read_kernel)|^\s*(Duration|DRAM Throughput|Warp Cycles Per Issued Instruction|Issue Slots Busy|Registers Per Thread) " \
      "$OUT/ncu_$tag.txt" | head -12 | sed -E "s/ +/ /g; s/\(unnamed>::DecodeParams\)//; s/, Context.*//; s/^/  $tag:/" | cut -c1-160
  done
fi

# SRCJOBS (decode v15): source-level profiles, entries as NCUJOBS's
# ("SHAPE:NAME:VAR=VALUE", ';' between entries, '+' for the spaces in
# SHAPE): the decode kernel of one call (after 3 warm-up calls), its warp
# stall samples per SASS instruction (--section SourceCounters), exported as
# CSV (gzipped) and summarised by tools/ncu_srcsum.py into src_NAME.txt.
if [ -n "${SRCJOBS:-}" ] && [ -n "$NCU_BIN" ]; then
  IFS=';' read -ra sjobs <<<"${SRCJOBS//+/ }"
  for job in "${sjobs[@]}"; do
    shape=${job%%:*}; rest=${job#*:}; name=${rest%%:*}; ev=${rest#*:}
    [ $(el) -lt 160 ] || { echo "skip src $shape $name (time)"; continue; }
    phase "src $name ($shape, $ev)"
    env FP8KV_BENCH_WARMUP_MS=0 ${ev//,/ } timeout 40 "$NCU_BIN" --clock-control none -k regex:decode_kernel \
      --launch-skip 3 --launch-count 1 --section SourceCounters --section WarpStateStats --import-source no \
      -f -o "$OUT/prof_$name" $BENCH shape $shape >"$OUT/ncu_src_$name.log" 2>&1 || echo "ncu src $name: rc $?"
    timeout 40 "$NCU_BIN" -i "$OUT/prof_$name.ncu-rep" --page source --csv --print-source sass >"$OUT/src_$name.csv" 2>/dev/null
    python3 tools/ncu_srcsum.py "$OUT/src_$name.csv" >"$OUT/src_$name.txt" 2>&1
    head -3 "$OUT/src_$name.txt"
    gzip -f "$OUT/src_$name.csv"; rm -f "$OUT/prof_$name.ncu-rep"
  done
fi

# The rows (H HKV D B CTX), each measured in a fresh process / CUDA context.
ROWS=()
for B in 1 8 32 64; do for C in 1024 4096 16384 65536; do ROWS+=("32 8 128 $B $C"); done; done
for B in 1 8 32; do for C in 16384 65536; do ROWS+=("16 8 256 $B $C"); done; done

if [ $(el) -lt 165 ]; then
  phase "sdpa (fresh context per row)"
  SARGS=(); for r in "${ROWS[@]}"; do SARGS+=("${r// /,}"); done
  timeout $(( 190 - $(el) < 45 ? 190 - $(el) : 45 )) python3 tools/bench_sdpa.py --decode-fresh "${SARGS[@]}" >"$OUT/sdpa.jsonl" 2>"$OUT/sdpa.err"
  rc=$?
  echo "sdpa rows: $(grep -c sdpa_decode "$OUT/sdpa.jsonl") of ${#ROWS[@]} (rc $rc)"; tail -2 "$OUT/sdpa.err"
fi

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
bench_rows base 185 "fp8_e4m3 bf16" "128 256" "1 8 32 64"
# The read-only ceiling (decode v12): a streaming kernel that only reads, as
# decode does (the copy ceiling also writes); the table prints it beside the copy.
timeout 20 $BENCH read >"$OUT/read.jsonl" 2>>"$OUT/bench_base.err" || echo "read ceiling: rc $?"
[ -n "$SMI_PID" ] && kill "$SMI_PID" 2>/dev/null

phase sass
SASS_ALL=$(mktemp)
cuobjdump -sass $BENCH >"$SASS_ALL" 2>/dev/null
awk '/Function :/ {f=$3; n[f]=0} /LDL|STL/ {l[f]++} END {for (k in n) printf "%s LDL/STL=%d\n", k, l[k]}' "$SASS_ALL" |
  grep -E "decode_kernel|decode_reduce" | sed -E 's/^_ZN.*_cu_[0-9a-f]+[0-9][0-9](decode_)/\1/; s/EEvN[^ ]*//' |
  sort >"$OUT/sass.txt"
if [ ! -s "$OUT/sass.txt" ]; then echo "SASS CHECK: no decode kernels found" | tee -a "$OUT/sass.txt"
elif grep -vq "LDL/STL=0$" "$OUT/sass.txt"; then grep -v "LDL/STL=0$" "$OUT/sass.txt"; echo "SASS CHECK: FAIL (local memory above)"
else echo "SASS CHECK: ok (no LDL/STL in $(wc -l <"$OUT/sass.txt") decode kernels)"; fi
# The SASS of the kernels the A/B compares (FAST, the default: fp8 d128, bf16
# d128 DEEP, fp8 d256 REG; FAST with the fused merge; the version-8 fp8 d128
# kernel) and an opcode histogram of each, for reading.
awk -v out="$OUT" '
  /Function :/ { f = ""; n = $3
    if (n ~ /decode_kernelILi128ELi1ELb0ELb0ELb0ELb0ELb0ELb0EEEv/) f = "fp8_d128_old"
    if (n ~ /decode_kernelILi128ELi1ELb0ELb0ELb0ELb0ELb1ELb0EEEv/) f = "fp8_d128_v9"
    if (n ~ /decode_kernelILi128ELi1ELb0ELb0ELb0ELb0ELb1ELb1EEEv/) f = "fp8_d128_fuse"
    if (n ~ /decode_kernelILi128ELi1ELb0ELb1ELb0ELb0ELb1ELb0EEEv/) f = "fp8_d128_f4"
    if (n ~ /decode_kernelILi128ELi0ELb1ELb0ELb0ELb0ELb1ELb0EEEv/) f = "bf16_d128_v9"
    if (n ~ /decode_kernelILi256ELi1ELb0ELb0ELb0ELb1ELb1ELb0EEEv/) f = "fp8_d256_v9"
    if (n ~ /decode_kernelILi256ELi1ELb0ELb0ELb0ELb1ELb1ELb1EEEv/) f = "fp8_d256_fuse" }
  f != "" { print > (out "/sass_" f ".txt") }' "$SASS_ALL"
rm -f "$SASS_ALL"
for f in "$OUT"/sass_*_*.txt; do
  [ -f "$f" ] || continue
  grep -oE "^\s+/\*[0-9a-f]+\*/\s+[@!A-Z0-9_.]+( [A-Z0-9_.]+)?" "$f" | awk -v name="$(basename "$f" .txt)" '{op=$2; if (op ~ /^@/) op=$3; sub(/\..*/, "", op); h[op]++; t++}
    END {printf "%s total=%d", name, t; for (k in h) if (h[k] >= 8) printf " %s=%d", k, h[k]; printf "\n"}' >>"$OUT/sass_hist.txt"
done
[ -s "$OUT/sass_hist.txt" ] && cat "$OUT/sass_hist.txt"

phase table
python3 tools/decode_table.py "$OUT" | tee "$OUT/table.txt"
phase done
