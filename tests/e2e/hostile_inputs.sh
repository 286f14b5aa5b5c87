#!/usr/bin/env bash
# Hostile inputs beyond issue 15's list (2026-12-01, docs/robustness.md): each
# must exit 2 with a message naming the file / flag / field, print nothing on
# stdout, never hang, crash or write a partial output. Also the one-rule-per-
# flag cases (docs/design.md "One rule per flag"): --context, --max-model-len,
# --chunk-size (omitted = default, 0 refused), --seed (-1 = random), size flags.
# Usage: bash hostile_inputs.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
python3 "$HERE/tiny_model.py" "$T/m" > /dev/null || fail "make tiny model"
M="$T/m"
printf 'Hello there. ' > "$T/good.txt"
: > "$T/empty.txt"
mkfifo "$T/fifo"
edit_json() {  # edit_json SRC DST PYTHON-EXPR-ON-j
  python3 - "$1" "$2" "$3" <<'PY' || fail "edit_json $2"
import json, sys
j = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(j, open(sys.argv[2], "w"))
PY
}
# t: a refusal that must also come back quickly (a FIFO must not block).
t() { local name=$1 want=$2; shift 2; expect_refused "$name" "$want" timeout 60 "$@"; }

# --- one rule per flag -------------------------------------------------------
for cmd in "score $M --text-file $T/good.txt --output $T/s.json" "calibrate $M --corpus $T/good.txt --output $T/r.json" \
           "eval compare $M --text-file $T/good.txt" "eval kvstats $M --text-file $T/good.txt --scales unity"; do
  # shellcheck disable=SC2086
  t "${cmd%% *} --context 0" "--context: must be >= 2 (got 0)" "$BIN" $cmd --context 0
  # shellcheck disable=SC2086
  t "${cmd%% *} --context -3" "--context: must be >= 2 (got -3)" "$BIN" $cmd --context -3
  # shellcheck disable=SC2086
  t "${cmd%% *} --max-model-len 0" "--max-model-len: must be >= 1 (got 0)" "$BIN" $cmd --max-model-len 0
done
t "capacity --max-model-len 0" "--max-model-len: must be >= 1 (got 0)" "$BIN" capacity "$M" --kv-memory 1GiB --max-model-len 0
t "score --chunk-size 0" "--chunk-size: must be >= 1 (got 0)" "$BIN" score "$M" --text-file "$T/good.txt" --output "$T/s.json" --chunk-size 0
t "--kv-memory -1GiB names the flag" "--kv-memory: invalid size '-1GiB'" "$BIN" generate "$M" --prompt hi --kv-memory -1GiB
t "--kv-memory abc names the flag" "--kv-memory: invalid size 'abc'" "$BIN" score "$M" --text-file "$T/good.txt" --output "$T/s.json" --kv-memory abc
t "capacity --gpu-memory -3" "--gpu-memory: invalid size '-3'" "$BIN" capacity "$M" --gpu-memory -3
t "--temperature nan" "--temperature: must be a finite number >= 0 (got nan)" "$BIN" generate "$M" --prompt hi --temperature nan
t "--temperature inf" "--temperature: must be a finite number >= 0 (got inf)" "$BIN" generate "$M" --prompt hi --temperature inf
t "bench serve --request-timeout nan" "--request-timeout: must be a finite number > 0 (got nan)" "$BIN" bench serve --request-timeout nan
# --seed: -1 = random (logged, so the run can be repeated); other negatives,
# 2^64 and non-integers refused; the largest uint64 accepted.
for s in -5 18446744073709551616 1.5 abc; do
  t "generate --seed $s" "--seed: must be -1 (random) or an integer in [0, 18446744073709551615] (got $s)" \
    "$BIN" generate "$M" --prompt hi --max-tokens 2 --seed "$s"
done
t "eval niah --seed -2" "--seed: must be -1 (random)" "$BIN" eval niah "$M" --haystack "$T/good.txt" --lengths 64 --depths 50 --seed -2
t "eval compare --seed -2" "--seed: must be -1 (random)" "$BIN" eval compare "$M" --text-file "$T/good.txt" --seed -2
t "bench serve --seed -2" "--seed: must be -1 (random)" "$BIN" bench serve --seed -2
expect_rc 0 "$BIN" generate "$M" --prompt hi --max-tokens 2 --seed 18446744073709551615
expect_rc 0 "$BIN" generate "$M" --prompt hi --max-tokens 3 --temperature 1 --seed -1
grep -q "^--seed -1: drew random seed [0-9]\+$" "$T/err" || fail "seed -1: no drawn seed logged: $(cat "$T/err")"
drawn=$(sed -n 's/^--seed -1: drew random seed //p' "$T/err"); cp "$T/out" "$T/rand.out"
expect_rc 0 "$BIN" generate "$M" --prompt hi --max-tokens 3 --temperature 1 --seed "$drawn"
cmp -s "$T/out" "$T/rand.out" || fail "seed -1: re-running with the logged seed gave other text"
echo "ok   --seed -1 is random, logged and repeatable"

# --- input files that are not regular files ------------------------------------
t "--text-file FIFO (no hang)" "--text-file $T/fifo: is not a regular file (a FIFO)" "$BIN" tokenize "$M" --text-file "$T/fifo"
t "--text-file /dev/zero" "--text-file /dev/zero: is not a regular file (a character device)" "$BIN" tokenize "$M" --text-file /dev/zero
t "--corpus /dev/null" "--corpus /dev/null: is not a regular file" "$BIN" calibrate "$M" --corpus /dev/null --output "$T/r.json"
cp -r "$M" "$T/mf"; rm "$T/mf/model.safetensors"; mkfifo "$T/mf/model.safetensors"
t "model.safetensors is a FIFO (no hang)" "$T/mf/model.safetensors: not a regular file" "$BIN" inspect "$T/mf"
cp -r "$M" "$T/mc"; rm "$T/mc/config.json"; mkfifo "$T/mc/config.json"
t "config.json is a FIFO (no hang)" "$T/mc/config.json: is not a regular file (a FIFO)" "$BIN" capacity "$T/mc" --kv-memory 1GiB
cp -r "$M" "$T/mt"; rm "$T/mt/tokenizer_config.json"; mkfifo "$T/mt/tokenizer_config.json"
t "tokenizer_config.json is a FIFO (no hang)" "$T/mt/tokenizer_config.json: not a regular file" "$BIN" tokenize "$T/mt" --text x
t "serve: tokenizer_config.json is a FIFO (no hang)" "$T/mt/tokenizer_config.json: not a regular file" "$BIN" serve "$T/mt" --port 0
cp -r "$M" "$T/md"; rm "$T/md/model.safetensors"; mkdir "$T/md/model.safetensors"
t "model.safetensors is a directory" "$T/md/model.safetensors: not a regular file" "$BIN" inspect "$T/md"
t "checkpoint dir is a file" "$T/good.txt: not a directory" "$BIN" inspect "$T/good.txt"
t "calibrate empty corpus" "--corpus $T/empty.txt: empty file" "$BIN" calibrate "$M" --corpus "$T/empty.txt" --output "$T/r.json"
[ -e "$T/r.json" ] && fail "calibrate wrote a report"

# --- output paths ---------------------------------------------------------------
# /dev/null (or any device / FIFO) would be replaced by a regular file by the
# atomic rename: refused before anything runs.
t "score --output /dev/null" "--output /dev/null: is not a regular file" "$BIN" score "$M" --text-file "$T/good.txt" --output /dev/null
[ -c /dev/null ] || fail "/dev/null is no longer a device"
t "compare --html FIFO" "--html $T/fifo: is not a regular file" "$BIN" eval compare "$M" --text-file "$T/good.txt" --html "$T/fifo"
# A directory that access() calls writable but is not (root in /proc): probed
# by creating a file, so refused before the computation (issue 15 item 16).
if [ -d /proc/self ]; then
  t "compare --html under /proc" "--html /proc/r.html: cannot write in /proc" \
    "$BIN" eval compare "$M" --text-file "$T/good.txt" --output "$T/cmp.json" --html /proc/r.html
  [ -e "$T/cmp.json" ] && fail "compare wrote its JSON although --html was bad"
  cat > "$T/report.json" <<'JSON'
{"status": "complete", "target": "fp8_e4m3", "rule": "safety:1.3", "layers": [
 {"layer": 0, "k_scale": 1.0, "v_scale": 2.0, "q_scale": 1.0},
 {"layer": 1, "k_scale": 1.0, "v_scale": 3.0, "q_scale": 1.0}]}
JSON
  t "inject --output under /proc" "--output /proc/new: cannot write in /proc" \
    "$BIN" inject "$M" --report "$T/report.json" --output /proc/new
fi
# Unicode paths work (exit 0), for input and output.
mkdir -p "$T/ünï cødé"; cp "$T/good.txt" "$T/ünï cødé/t.txt"
expect_rc 0 "$BIN" score "$M" --text-file "$T/ünï cødé/t.txt" --output "$T/ünï cødé/o.json"
[ -s "$T/ünï cødé/o.json" ] || fail "unicode output path not written"
echo "ok   unicode paths"

# --- JSON files of the wrong shape --------------------------------------------------
mkdir -p "$T/ca"; echo '[]' > "$T/ca/config.json"
t "config.json is an array" "$T/ca/config.json: expected a JSON object" "$BIN" capacity "$T/ca" --kv-memory 1GiB
mkdir -p "$T/ce"; : > "$T/ce/config.json"
t "config.json is empty" "$T/ce/config.json: invalid JSON" "$BIN" capacity "$T/ce" --kv-memory 1GiB
mkdir -p "$T/cn"; edit_json "$M/config.json" "$T/cn/config.json" 'j["num_attention_heads"] = None'
t "num_attention_heads null: head_dim derivation named" \
  "field 'head_dim': missing, and hidden_size 32 / num_attention_heads 32 = 1 is odd" "$BIN" capacity "$T/cn" --kv-memory 1GiB
for expr in 'j["model"] = None' 'j["added_tokens"] = [None]' 'j["model"]["merges"] = [None]' 'j = []'; do
  cp -r "$M" "$T/tn"; edit_json "$M/tokenizer.json" "$T/tn/tokenizer.json" "$expr"
  t "tokenizer.json: $expr" "$T/tn/tokenizer.json: " "$BIN" tokenize "$T/tn" --text hi
  rm -rf "$T/tn"
done
cp -r "$M" "$T/ta"; edit_json "$M/tokenizer.json" "$T/ta/tokenizer.json" 'j["added_tokens"][0]["id"] = 2**40'
t "added_tokens id 2^40 states the bound (issue 15 item 14)" \
  "added_tokens[0]: \"id\" must be an integer in [0, 67108864 (2^26)], got 1099511627776" "$BIN" tokenize "$T/ta" --text hi
t "detokenize unknown id" "--ids: id 99999999 is not in the vocabulary of $M" "$BIN" detokenize "$M" --ids 99999999
echo '[1e400]' > "$T/ids.json"
t "token ids 1e400" "$T/ids.json: not valid JSON" "$BIN" score "$M" --token-ids-file "$T/ids.json" --output "$T/s.json"

# --- server flags -------------------------------------------------------------------
t "serve --host empty" "--host must not be empty" "$BIN" serve "$M" --host "" --port 0
echo "hostile_inputs: ok"
