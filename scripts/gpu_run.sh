#!/usr/bin/env bash
# GPU machine: the entry point of a device call with binaries packed here by
# scripts/pack_prebuilt.sh and carried in .wt (docs/cuda.md, top).
#   bash scripts/gpu_run.sh SCRIPT [SCRIPT ...]    (e.g. scripts/gpu_decode.sh scripts/gpu_ab.sh)
# Unpacks .wt/bin.tar.xz into .wt/bin (PREBUILT for gpu_kernel_build.sh) and
# the runtime .debs; runs each SCRIPT in its own process session with a
# timeout (LIMIT seconds each, default 400; the whole session is killed on
# timeout, so no child keeps the GPU), its output in $OUT/NAME/console.log;
# then packs $OUT's folders into $OUT/logs.tgz (a device call brings back 8
# files at most) and leaves each folder's table / summary files beside it.
# For scripts/gpu_ab.sh, OLD defaults to .wt/prev_bench_attention.xz and NEW
# to the carried bench_attention.
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-/tmp/fp8kv-out}
WORK=$(mktemp -d)
mkdir -p .wt/bin "$FINAL"
tar xJf .wt/bin.tar.xz -C .wt/bin && chmod +x .wt/bin/*
[ -d .debs ] || { mkdir -p .debs && cp .wt/debs/*.deb .debs/; }
export PREBUILT=$PWD/.wt/bin
export FP8KV_GIT_COMMIT=${FP8KV_GIT_COMMIT:-$(cat .wt/COMMIT 2>/dev/null)}
export OLD=${OLD:-.wt/prev_bench_attention.xz} NEW=${NEW:-$PWD/.wt/bin/bench_attention}
finish() {
  tar czf "$FINAL/logs.tgz" -C "$WORK" . 2>/dev/null
  for d in "$WORK"/*/; do
    n=$(basename "$d")
    for f in table.txt ab.txt; do [ -f "$d/$f" ] && cp "$d/$f" "$FINAL/${n}_$f"; done
  done
}
trap finish EXIT
worst=0
for s in "$@"; do
  n=$(basename "$s" .sh)
  mkdir -p "$WORK/$n"
  echo "== $s"
  # setsid in a background job is no group leader, so it keeps its pid: the
  # new session's id, which the watchdog kills whole.
  OUT=$WORK/$n setsid bash "$s" > >(tee "$WORK/$n/console.log") 2>&1 &
  pid=$!
  ( sleep "${LIMIT:-400}"; echo "== $s: time limit"; kill -TERM -- -"$pid" 2>/dev/null; sleep 5; kill -KILL -- -"$pid" 2>/dev/null ) &
  dog=$!
  wait "$pid"; rc=$?; echo "== $s: rc $rc"
  [ $rc -gt $worst ] && worst=$rc
  kill "$dog" 2>/dev/null; wait "$dog" 2>/dev/null
done
exit $worst
