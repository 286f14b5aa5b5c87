#!/usr/bin/env bash
# e2e: the engine flags mean the same in every command that runs the engine
# (cli/engine_flags.h): bad values exit 2 with one "--flag must be ..." line,
# --threads above the hardware is capped with a warning, --load-format dummy
# runs from config.json alone, --tokenizer points elsewhere.
# Usage: bash engine_flags.sh <fp8kv-binary> <source-dir>
set -u
BIN="$1"; SRC="$2"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_rc() {
  local want=$1; shift
  "$@" >"$T/out" 2>"$T/err"; local rc=$?
  [ "$rc" = "$want" ] || { cat "$T/err" >&2; fail "expected exit $want, got $rc: $*"; }
}
python3 "$SRC/tests/e2e/tiny_model.py" "$T/m" --bf16 > /dev/null || fail "could not make the tiny model"
python3 -c "import json; json.dump([[5, 6, 7, 8, 9, 10, 11, 12]], open('$T/ids.json', 'w'))"
printf 'hello there, a short corpus.\n' > "$T/c.txt"

# One invocation per command, with the extra flags appended.
run_cmd() {  # run_cmd CMD FLAGS...
  local cmd=$1; shift
  case $cmd in
    generate) "$BIN" generate "$T/m" --prompt "Hello" --max-tokens 2 "$@" ;;
    score) "$BIN" score "$T/m" --token-ids-file "$T/ids.json" --output "$T/s.json" "$@" ;;
    calibrate) "$BIN" calibrate "$T/m" --corpus-ids-file "$T/ids.json" --output "$T/r.json" "$@" ;;
    kvstats) "$BIN" eval kvstats "$T/m" --token-ids-file "$T/ids.json" --scales unity "$@" ;;
    compare) "$BIN" eval compare "$T/m" --token-ids-file "$T/ids.json" --bootstrap 100 "$@" ;;
  esac
}
refused() {  # refused MESSAGE CMD FLAGS...: exit 2, one line naming the flag, no CLI11 range text
  local msg=$1; shift
  run_cmd "$@" > "$T/out" 2> "$T/err"; local rc=$?
  [ "$rc" = 2 ] || { cat "$T/err" >&2; fail "expected exit 2, got $rc: $*"; }
  grep -q -- "$msg" "$T/err" || fail "'$*': expected '$msg' in: $(cat "$T/err")"
  ! grep -q "not in range" "$T/err" || fail "'$*': CLI11 range text: $(cat "$T/err")"
}
for cmd in generate score calibrate kvstats compare; do
  refused "must be > 0" $cmd --kv-memory 0
  refused "threads must be >= 0" $cmd --threads -1
  refused "max-num-seqs must be >= 1" $cmd --max-num-seqs 0
  refused "max-num-batched-tokens must be >= 1" $cmd --max-num-batched-tokens 0
  refused "block-size must be >= 1" $cmd --block-size 0
  refused "not both" $cmd --kv-memory 1MiB --gpu-memory-utilization 0.5
  refused "cuda only" $cmd --backend cpu --gpu-memory-utilization 0.5
  refused "must be in (0, 1]" $cmd --gpu-memory-utilization 1.5
  refused "load-format must be auto or dummy" $cmd --load-format bogus
  refused "backend must be auto, cpu or cuda" $cmd --backend tpu
done
# --backend cuda: refused in one line until the CUDA engine lands (or no GPU here).
if ! command -v nvidia-smi > /dev/null 2>&1; then
  refused "--backend cuda" generate --backend cuda
fi

# --threads above the hardware threads: capped, with a warning, same output.
expect_rc 0 run_cmd generate --threads 1
cp "$T/out" "$T/g1"
expect_rc 0 run_cmd generate --threads 100000
grep -q "exceeds the .* hardware threads" "$T/err" || fail "no warning for --threads 100000: $(cat "$T/err")"
cmp -s "$T/g1" "$T/out" || fail "capped threads changed the output"

# --load-format dummy: config.json alone is enough.
mkdir -p "$T/cfgonly"
cp "$T/m/config.json" "$T/cfgonly/"
expect_rc 0 "$BIN" score "$T/cfgonly" --token-ids-file "$T/ids.json" --output "$T/d.json" --load-format dummy
grep -q "dummy" "$T/err" || fail "no dummy-weights log line"
expect_rc 2 "$BIN" score "$T/cfgonly" --token-ids-file "$T/ids.json" --output "$T/d.json"

# --tokenizer: a model directory without tokenizer.json, tokenizer from elsewhere.
cp "$T/m/config.json" "$T/cfgonly/config.json"
expect_rc 0 "$BIN" generate "$T/cfgonly" --prompt "Hello" --max-tokens 2 --load-format dummy --tokenizer "$T/m"
expect_rc 2 "$BIN" generate "$T/cfgonly" --prompt "Hello" --max-tokens 2 --load-format dummy

# New flags are accepted where they apply.
expect_rc 0 run_cmd score --max-num-seqs 4 --max-num-batched-tokens 16 --enforce-eager
echo "engine_flags: ok"
