#!/usr/bin/env bash
# GPU machine: two bench_attention binaries on the same rows, interleaved
# (docs/design.md "Performance method": a change without a switch is
# compared with the previous build on one machine, never across runs).
#   OLD=path NEW=path [ROWS="fp8_e4m3 128 8 16384;..."] [REPS=5] [GATE=200] bash scripts/gpu_ab.sh
# OLD / NEW: bench_attention binaries (a .xz is unpacked first), e.g. built
# on the development machine and carried in an ignored folder; OLD_ENV /
# NEW_ENV: VAR=VALUE words set for that side only (the same binary twice
# with a switch flipped: OLD=NEW OLD_ENV="FP8KV_DECODE_X=0"). Each row runs
# REPS pairs of fresh processes, the order flipped every pair; stops starting
# pairs after GATE seconds. Writes $OUT/ab_old.jsonl, ab_new.jsonl, ab.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fp8kv-out}
mkdir -p "$OUT"
source scripts/gpu_env.sh
unpack() {  # path -> a runnable path
  case $1 in
    *.xz) local f=/tmp/gpu_ab_$2; xz -dc "$1" >"$f" && chmod +x "$f" && echo "$f" ;;
    *) echo "$1" ;;
  esac
}
BIN_old=$(unpack "${OLD:?OLD=bench_attention of the previous build}" old)
BIN_new=$(unpack "${NEW:?NEW=bench_attention of this build}" new)
ROWS=${ROWS:-"fp8_e4m3 128 1 1024;fp8_e4m3 128 1 65536;fp8_e4m3 128 8 16384;fp8_e4m3 128 32 16384;fp8_e4m3 128 64 16384;bf16 128 1 1024;fp8_e4m3 256 8 16384"}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/env.txt"
: >"$OUT/ab_old.jsonl"; : >"$OUT/ab_new.jsonl"
T0=$(date +%s)
IFS=';' read -ra R <<<"$ROWS"
for rep in $(seq 1 "${REPS:-5}"); do
  for row in "${R[@]}"; do
    [ $(( $(date +%s) - T0 )) -lt "${GATE:-200}" ] || { echo "stop at pair $rep (time)"; break 2; }
    if (( rep % 2 )); then order="old new"; else order="new old"; fi
    for v in $order; do
      bin=BIN_$v; envv=${v^^}_ENV
      env ${!envv:-} timeout 10 "${!bin}" shape $row >>"$OUT/ab_$v.jsonl" 2>>"$OUT/ab.err" || echo "row $v $row: rc $?"
    done
  done
done
python3 tools/ab_table.py "$OUT" old new | tee "$OUT/ab.txt"
