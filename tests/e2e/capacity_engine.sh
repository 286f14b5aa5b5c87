#!/usr/bin/env bash
# The engine's pool equals what `fp8kv capacity` plans: run engine commands
# with --kv-memory on a tiny checkpoint and compare their `KV cache:` log line
# with `fp8kv capacity --json`'s log_line for the same settings (several
# budgets, including ones that are not a multiple of the page, and fp8 when
# `fp8kv score` is available).
# Usage: bash capacity_engine.sh <fp8kv-binary> <source-dir>
set -u
BIN=$1; SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
python3 "$SRC/tests/e2e/inject_make_checkpoint.py" "$T/m" > /dev/null || fail "make checkpoint"
python3 -c "import json; json.dump([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]], open('$T/ids.json', 'w'))"

capacity_line() {  # capacity_line MEM DTYPE -> the planned log line
  "$BIN" capacity "$T/m" --kv-memory "$1" --kv-cache-dtype "$2" --json > "$T/cap.json" 2> "$T/cap.err" \
    || fail "capacity $1 $2: $(cat "$T/cap.err")"
  python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['log_line'])" "$T/cap.json"
}
engine_line() {  # engine_line FILE -> the engine's logged line
  grep -o "KV cache: .*" "$1" | head -1
}

# The tiny llama: 3 layers x 2 kv heads x head_dim 16; bf16 page = 16 x 3 x 2 x 2 x 16 x 2 = 6144 B.
checked=0
for mem in 1000000 6144000 614400 6143999; do
  want=$(capacity_line "$mem" bf16)
  "$BIN" calibrate "$T/m" --corpus-ids-file "$T/ids.json" --output "$T/r.json" --kv-memory "$mem" \
    > /dev/null 2> "$T/eng.err" || fail "calibrate --kv-memory $mem: $(cat "$T/eng.err")"
  got=$(engine_line "$T/eng.err")
  [ -n "$got" ] || fail "engine logged no KV cache line: $(cat "$T/eng.err")"
  [ "$got" = "$want" ] || fail "kv-memory $mem: engine '$got' != capacity '$want'"
  checked=$((checked + 1))
done
# Hand check of one: 1000000 B / 6144 B = 162 blocks; 256 / 16 = 16 blocks a request.
[ "$(capacity_line 1000000 bf16)" = "KV cache: 2592 tokens (162 blocks of 16), max concurrency 10.12x at max_model_len 256, dtype bf16" ] \
  || fail "hand-computed line: $(capacity_line 1000000 bf16)"

# fp8 through `fp8kv score` (when built): the cache dtype flows into the plan too.
if "$BIN" score --help 2>/dev/null | grep -q -- "--kv-cache-dtype"; then
  for dt in fp8 bf16; do
    for mem in 1000000 3071999; do
      want=$(capacity_line "$mem" "$dt")
      "$BIN" score "$T/m" --token-ids-file "$T/ids.json" --output "$T/s.json" --kv-memory "$mem" \
        --kv-cache-dtype "$dt" > /dev/null 2> "$T/eng.err" || fail "score $dt $mem: $(cat "$T/eng.err")"
      got=$(engine_line "$T/eng.err")
      [ "$got" = "$want" ] || fail "score $dt kv-memory $mem: engine '$got' != capacity '$want'"
      checked=$((checked + 1))
    done
  done
fi
echo "capacity_engine e2e: ok ($checked engine runs matched)"
