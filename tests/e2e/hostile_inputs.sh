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
t "--text-file FIFO (no hang)" "--text-file $T/fifo: is a FIFO, expected a file" "$BIN" tokenize "$M" --text-file "$T/fifo"
t "--text-file /dev/zero" "--text-file /dev/zero: is a character device, expected a file" "$BIN" tokenize "$M" --text-file /dev/zero
t "--corpus /dev/null" "--corpus /dev/null: is a character device" "$BIN" calibrate "$M" --corpus /dev/null --output "$T/r.json"
cp -r "$M" "$T/mf"; rm "$T/mf/model.safetensors"; mkfifo "$T/mf/model.safetensors"
t "model.safetensors is a FIFO (no hang)" "$T/mf/model.safetensors: not a regular file" "$BIN" inspect "$T/mf"
cp -r "$M" "$T/mc"; rm "$T/mc/config.json"; mkfifo "$T/mc/config.json"
t "config.json is a FIFO (no hang)" "$T/mc/config.json: is not a regular file (a FIFO)" "$BIN" capacity "$T/mc" --kv-memory 1GiB
cp -r "$M" "$T/mt"; rm "$T/mt/tokenizer_config.json"; mkfifo "$T/mt/tokenizer_config.json"
t "tokenizer_config.json is a FIFO (no hang)" "$T/mt/tokenizer_config.json: is a FIFO, expected a file" "$BIN" tokenize "$T/mt" --text x
t "serve: tokenizer_config.json is a FIFO (no hang)" "$T/mt/tokenizer_config.json: is a FIFO, expected a file" "$BIN" serve "$T/mt" --port 0
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
  write_report "$T/report.json" complete 1.0:2.0 1.0:3.0
  t "inject --output under /proc" "--output /proc/new: cannot write in /proc" \
    "$BIN" inject "$M" --report "$T/report.json" --output /proc/new
fi
# Unicode paths work (exit 0), for input and output.
mkdir -p "$T/ünï cødé"; cp "$T/good.txt" "$T/ünï cødé/t.txt"
expect_rc 0 "$BIN" score "$M" --text-file "$T/ünï cødé/t.txt" --output "$T/ünï cødé/o.json"
[ -s "$T/ünï cødé/o.json" ] || fail "unicode output path not written"
echo "ok   unicode paths"

# bench serve's result file: checked before the run (no server is needed to
# see the refusal: port 1 has none, and the check comes first).
bs=("$BIN" bench serve --port 1 --num-prompts 1)
t "bench serve --result-dir missing" "--result-dir /nonexistent: directory /nonexistent does not exist" "${bs[@]}" --save-result --result-dir /nonexistent
t "bench serve --result-dir a file" "--result-dir $T/good.txt: $T/good.txt is not a directory" "${bs[@]}" --save-result --result-dir "$T/good.txt"
t "bench serve --result-dir FIFO" "is not a directory" "${bs[@]}" --save-result --result-dir "$T/fifo"
t "bench serve --result-filename in a missing folder" "--result-filename $T/sub/r.json: directory $T/sub does not exist" \
  "${bs[@]}" --save-result --result-dir "$T" --result-filename sub/r.json
t "bench serve --result-filename /dev/null" "--result-filename /dev/null: is not a regular file" "${bs[@]}" --save-result --result-filename /dev/null
t "bench serve --result-filename a directory" "--result-filename $T: is a directory" "${bs[@]}" --save-result --result-filename "$T"
t "bench serve --result-dir ''" "--result-dir: empty value" "${bs[@]}" --save-result --result-dir ""
t "bench serve --result-dir without --save-result" "--result-dir writes nothing without --save-result" "${bs[@]}" --result-dir "$T"
if [ -d /proc/self ]; then
  t "bench serve --result-dir /proc" "--result-dir /proc: cannot write in /proc" "${bs[@]}" --save-result --result-dir /proc
fi
t "bench serve, good result path: the server is what fails" \
  "cannot reach http://127.0.0.1:1: Connection: could not connect (refused, or nothing listens there" \
  "${bs[@]}" --save-result --result-dir "$T" --result-filename r.json

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
t "token ids 1e400" "--token-ids-file $T/ids.json: invalid JSON" "$BIN" score "$M" --token-ids-file "$T/ids.json" --output "$T/s.json"

# --- issue 37 B: recursion depth (JSON files nested beyond any real file) ---------
deep() {  # deep N: a JSON normalizer Sequence nested N deep
  python3 -c "
n = $1
print('{\"type\": \"Sequence\", \"normalizers\": [' * n + '{\"type\": \"NFC\"}' + ']}' * n)"
}
for n in 101 100000; do
  cp -r "$M" "$T/deep"
  deep $n > "$T/deep.txt"
  python3 - "$M/tokenizer.json" "$T/deep/tokenizer.json" "$T/deep.txt" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["normalizer"] = None
s = json.dumps(j).replace('"normalizer": null', '"normalizer": ' + open(sys.argv[3]).read().strip(), 1)
open(sys.argv[2], "w").write(s)
PY
  t "tokenizer.json normalizer Sequence $n deep" "$T/deep/tokenizer.json: JSON nested deeper than 100 levels" \
    "$BIN" tokenize "$T/deep" --text hi
  rm -rf "$T/deep"
done
# Depth 99 still loads (a Sequence of Sequences is valid, only absurd depth is refused).
cp -r "$M" "$T/deep"
deep 48 > "$T/deep.txt"
python3 - "$M/tokenizer.json" "$T/deep/tokenizer.json" "$T/deep.txt" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); j["normalizer"] = None
open(sys.argv[2], "w").write(json.dumps(j).replace('"normalizer": null', '"normalizer": ' + open(sys.argv[3]).read().strip(), 1))
PY
expect_rc 0 "$BIN" tokenize "$T/deep" --text hi; rm -rf "$T/deep"; echo "ok   tokenizer.json Sequence 48 deep loads"
deep_json() { python3 -c "print('{\"a\": ' * $1 + '1' + '}' * $1)"; }
mkdir -p "$T/dc"; python3 - "$M/config.json" "$T/dc/config.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); j["x"] = None
open(sys.argv[2], "w").write(json.dumps(j).replace('"x": null', '"x": ' + '[' * 100000 + ']' * 100000))
PY
t "config.json nested 100000 deep" "$T/dc/config.json: JSON nested deeper than 100 levels" "$BIN" capacity "$T/dc" --kv-memory 1GiB
cp -r "$M" "$T/dg"; deep_json 100000 > "$T/dg/generation_config.json"
t "generation_config.json nested 100000 deep" "generation_config.json: JSON nested deeper than 100 levels" \
  "$BIN" generate "$T/dg" --prompt hi --max-tokens 2
cp -r "$M" "$T/dt"; deep_json 100000 > "$T/dt/tokenizer_config.json"
t "tokenizer_config.json nested 100000 deep" "tokenizer_config.json: JSON nested deeper than 100 levels" "$BIN" tokenize "$T/dt" --text hi
python3 -c "print('[' * 100000 + ']' * 100000)" > "$T/deep_ids.json"
t "--token-ids-file nested 100000 deep" "--token-ids-file $T/deep_ids.json: JSON nested deeper than 100 levels" \
  "$BIN" score "$M" --token-ids-file "$T/deep_ids.json" --output "$T/s.json"
t "--corpus-ids-file nested 100000 deep" "--corpus-ids-file $T/deep_ids.json: JSON nested deeper than 100 levels" \
  "$BIN" calibrate "$M" --corpus-ids-file "$T/deep_ids.json" --output "$T/r.json"
t "--report nested 100000 deep" "--report $T/deep_ids.json: JSON nested deeper than 100 levels" \
  "$BIN" inject "$M" --report "$T/deep_ids.json" --output "$T/inj_deep"
# Brackets inside strings do not count.
python3 -c "import json; print(json.dumps({'ids': [1, 2], }).replace('}', ', \"note\": \"' + '[' * 500 + '\"}'))" > "$T/str_ids.json"
t "brackets in a string are not nesting" 'or {"ids": [...]}' "$BIN" score "$M" --token-ids-file "$T/str_ids.json" --output "$T/s.json"

# --- issue 37 B: absurd sizes refused by arithmetic, at once -------------------------
# (ulimit -v: a run that allocated before refusing would be killed, not pass.
# An ASan binary cannot start under it: its shadow memory reserves terabytes
# of address space. There the cases that name the limit skip, the others run
# without it.)
LIM=(bash -c 'ulimit -v 4000000; exec "$@"' _)
if bin_has_asan; then LIM=(); echo "skip the ulimit -v wording checks (ASan build)"; fi
mkdir -p "$T/cl"; edit_json "$M/config.json" "$T/cl/config.json" 'j["num_hidden_layers"] = 2147483647'
t "capacity num_hidden_layers 2^31-1" "num_hidden_layers" "${LIM[@]}" "$BIN" capacity "$T/cl" --kv-memory 1GiB
cp -r "$M" "$T/mp"; edit_json "$M/config.json" "$T/mp/config.json" 'j["max_position_embeddings"] = 2147483647'
# max_model_len defaults to the model's limit (vLLM); one request of it must
# fit the machine (the least of physical memory, ulimit -v, the cgroup), else
# exit 2 at once naming max_model_len, where it came from and the bytes.
mpe="max_model_len 2147483647 (the model's limit: max_position_embeddings in config.json; --max-model-len not given) needs 256.00 GiB (274877906944 bytes)"
t "generate max_position_embeddings 2^31-1" "$mpe" "${LIM[@]}" "$BIN" generate "$T/mp" --prompt hi --max-tokens 2
bin_has_asan || grep -qF "more than the address-space limit (ulimit -v): 3.81 GiB (4096000000 bytes); give --max-model-len" "$T/err" ||
  fail "max_position_embeddings 2^31-1: the limit and the advice not named: $(cat "$T/err")"
t "score max_position_embeddings 2^31-1" "$mpe" "${LIM[@]}" "$BIN" score "$T/mp" --text-file "$T/good.txt" --output "$T/s.json"
t "serve max_position_embeddings 2^31-1" "$mpe" "${LIM[@]}" timeout 60 "$BIN" serve "$T/mp" --port 0
t "generate max_position_embeddings 2^31-1, no ulimit" "more than" "$BIN" generate "$T/mp" --prompt hi --max-tokens 2
t "generate max_position_embeddings 2^31-1 --kv-memory 1GiB" \
  "too small for one request of max_model_len 2147483647 (the model's limit: max_position_embeddings in config.json; --max-model-len not given)" \
  "${LIM[@]}" "$BIN" generate "$T/mp" --prompt hi --max-tokens 2 --kv-memory 1GiB
grep -qF "give --max-model-len 8388608 or less" "$T/err" || fail "--kv-memory 1GiB: no --max-model-len advice: $(cat "$T/err")"
t "generate --max-model-len 2^31-1 --kv-memory 1GiB" "max_model_len 2147483647 (--max-model-len) with bf16" \
  "$BIN" generate "$T/mp" --prompt hi --max-tokens 2 --kv-memory 1GiB --max-model-len 2147483647
expect_rc 0 "${LIM[@]}" "$BIN" generate "$T/mp" --prompt hi --max-tokens 2 --max-model-len 100
echo "ok   max_position_embeddings 2^31-1 runs with --max-model-len 100"
t "bench throughput --num-prompts 2^31-1" "--num-prompts 2147483647" "${LIM[@]}" "$BIN" bench throughput "$M" --num-prompts 2147483647 --input-len 8 --output-len 4

# --- issue 37 B: finite but absurd weights are bad input (exit 2), naming the stage ----
# Every weight finite, the logits NaN: the step is re-run checking the
# residual stream after each stage, and the first that overflowed is named
# with its largest weight (the CPU engine; docs/robustness.md).
big() {  # big TENSOR: a copy of M with 3.39e38 in the first 8 elements of TENSOR
  rm -rf "$T/big"; cp -r "$M" "$T/big"
  for i in 0 1 2 3 4 5 6 7; do python3 "$HERE/st_edit.py" "$T/big/model.safetensors" set-f32 "$1" $i 3.39e38; done
}
for case in "model.layers.1.input_layernorm.weight|layer 1's output overflowed float32" \
            "model.layers.0.post_attention_layernorm.weight|layer 0's output overflowed float32" \
            "model.layers.0.mlp.down_proj.weight|layer 0's output overflowed float32" \
            "model.layers.1.self_attn.q_proj.weight|layer 1's output overflowed float32" \
            "model.norm.weight|but the final norm's output overflowed float32" \
            "lm_head.weight|but the output projection overflowed float32"; do
  tn=${case%%|*}; want=${case#*|}
  big "$tn"
  t "generate, 3.39e38 in $tn" "$want" "$BIN" generate "$T/big" --prompt Hello --max-tokens 3
  grep -qF "its largest weight: $tn holds 3.39e+38" "$T/err" || fail "3.39e38 in $tn: tensor not named: $(cat "$T/err")"
  t "score, 3.39e38 in $tn" "$want" "$BIN" score "$T/big" --text-file "$T/good.txt" --output "$T/s.json"
done
big model.layers.1.input_layernorm.weight
t "generate -tp 2, 3.39e38 in a layernorm" "layer 1's output overflowed float32" \
  "$BIN" generate "$T/big" --prompt Hello --max-tokens 3 -tp 2 --threads 1
t "calibrate, 3.39e38 in a layernorm" "layer 1's output overflowed float32" \
  "$BIN" calibrate "$T/big" --corpus "$T/good.txt" --output "$T/r.json"
[ -e "$T/r.json" ] && fail "calibrate wrote a report from overflowing weights"
t "eval compare, 3.39e38 in a layernorm" "layer 1's output overflowed float32" \
  "$BIN" eval compare "$T/big" --text-file "$T/good.txt"
rm -rf "$T/big"

# --- issue 37 B: a KV scale that clips is counted and warned about, not silent ---------
# v_scale 1e-6 clips nearly all of V (docs/robustness.md "KV clipping"): the
# run succeeds, warns once per layer naming the scale, and prints the store's
# count; tensor-parallel ranks sum to the same count; bf16 counts nothing.
rm -rf "$T/clip"; cp -r "$M" "$T/clip"
for l in 0 1; do python3 "$HERE/st_edit.py" "$T/clip/model.safetensors" add-f32 "model.layers.$l.self_attn.v_scale" 1e-6; done
"$BIN" generate "$T/clip" --prompt Hello --max-tokens 3 --kv-cache-dtype fp8_e4m3 --threads 1 >"$T/out" 2>"$T/err" ||
  fail "generate with v_scale 1e-6: exit $?: $(cat "$T/err")"
for l in 0 1; do
  grep -qE "layer $l: [0-9]+ of [0-9]+ V values stored so far \([0-9.]+%\) clipped, \|x / v_scale\| beyond fp8_e4m3's max 448 \(v_scale 1e-06\)" "$T/err" ||
    fail "no clipping warning for layer $l: $(cat "$T/err")"
  [ "$(grep -c "layer $l: .* V values stored so far" "$T/err")" = 1 ] || fail "layer $l warned more than once: $(cat "$T/err")"
done
grep -q "K values stored so far" "$T/err" && fail "K warned at unity scales: $(cat "$T/err")"
line=$(grep "^KV clipped at store: " "$T/err") || fail "no clip count line: $(cat "$T/err")"
stats=$(grep "^prompt: " "$T/err")
python3 - "$line" "$stats" <<'PY' || fail "clip counts: $line ($stats)"
import re, sys
k, v, n = map(int, re.match(r"KV clipped at store: K (\d+), V (\d+) of (\d+) values each", sys.argv[1]).groups())
p, d = map(int, re.match(r"prompt: (\d+) tokens .*; decode: (\d+) tokens", sys.argv[2]).groups())
stored = (p + d) * 2 * 2 * 8  # tokens through the store x 2 layers x 2 KV heads x head_dim 8
assert n == stored, (n, stored)
assert k == 0 and 0.9 * n < v <= n, (k, v, n)
PY
"$BIN" generate "$T/clip" --prompt Hello --max-tokens 3 --kv-cache-dtype fp8_e4m3 --threads 1 -tp 2 >"$T/out" 2>"$T/err" ||
  fail "generate -tp 2 with v_scale 1e-6: $(cat "$T/err")"
[ "$(grep "^KV clipped at store: " "$T/err")" = "$line" ] || fail "-tp 2 counted otherwise: $(grep KV "$T/err") vs $line"
for d in bfloat16 fp8_per_token_head; do
  "$BIN" generate "$T/clip" --prompt Hello --max-tokens 3 --kv-cache-dtype $d --threads 1 >"$T/out" 2>"$T/err" ||
    fail "generate --kv-cache-dtype $d: $(cat "$T/err")"
  grep -qE "KV clipped at store|values stored so far" "$T/err" && fail "--kv-cache-dtype $d: a clip report: $(cat "$T/err")"
done
rm -rf "$T/clip"
echo "ok   v_scale 1e-6: counted and warned once per layer; -tp 2 counts the same; bf16, per-token-head: nothing"

# --- issue 37 B: a limit is named with where it came from -----------------------------
# bench sizes the engine for --input-len + --output-len when --max-model-len is
# not given: too long is the model's limit, never "--max-model-len 204".
origin="max_model_len 128 (the model's limit: max_position_embeddings in config.json; --max-model-len not given)"
t "bench latency --input-len past the model" "--input-len 200 + --output-len 4 = 204 tokens exceed $origin" \
  "$BIN" bench latency "$M" --input-len 200 --output-len 4
grep -qF -- "--max-model-len 204" "$T/err" && fail "bench blamed a --max-model-len never given: $(cat "$T/err")"
t "bench throughput --input-len past the model" "--input-len 100 + --output-len 100 = 200 tokens exceed $origin" \
  "$BIN" bench throughput "$M" --input-len 100 --output-len 100 --num-prompts 2
t "bench latency past a given --max-model-len" "--input-len 100 + --output-len 10 = 110 tokens exceed max_model_len 64 (--max-model-len)" \
  "$BIN" bench latency "$M" --input-len 100 --output-len 10 --max-model-len 64
t "bench latency --input-len 2^31-1 (no int overflow)" "exceed $origin" \
  "$BIN" bench latency "$M" --input-len 2147483647 --output-len 2147483647 --batch-size 1 --kv-memory 1GiB
t "niah --lengths past the model" "--lengths: 100000 exceeds $origin" \
  "$BIN" eval niah "$M" --haystack "$T/good.txt" --lengths 100000 --depths 50 --trials 1
t "niah --lengths past --max-model-len" "--lengths: 100 exceeds max_model_len 64 (--max-model-len)" \
  "$BIN" eval niah "$M" --haystack "$T/good.txt" --lengths 100 --depths 50 --trials 1 --max-model-len 64
# eval compare --bootstrap: its time grows with resamples x documents, so N is
# capped at 100000 (docs/eval.md "Bootstrap bounds"); its memory, resamples x
# (24 + 4 x documents + 8) bytes, is checked too. Both before any scoring
# (was: the out-of-memory message about --kv-memory, and no bound on time).
cap="give 100 to 100000 resamples (the default is 2000"
for n in 2000000000 2147483647 100001 99 -5; do
  t "eval compare --bootstrap $n" "--bootstrap $n: $cap" \
    "$BIN" eval compare "$M" --text-file "$T/good.txt" --text-file "$T/good.txt" --bootstrap "$n" --output "$T/cmp.json"
  grep -qF "compare [" "$T/err" && fail "--bootstrap $n was checked after the scoring: $(cat "$T/err")"
  [ -e "$T/cmp.json" ] && fail "compare wrote its report although --bootstrap $n was refused"
done
# At the cap, 6000 two-token documents need 100000 x 24032 bytes = 2.24 GiB of
# resample indices: more than half of the address-space limit.
python3 -c 'import json; print(json.dumps([[5, 6]] * 6000))' > "$T/docs6000.json"
if ! bin_has_asan; then
  t "eval compare --bootstrap 100000, 6000 documents" \
    "--bootstrap 100000: 100000 resamples x (24 + 4 x 6000 documents + 8) bytes = 2.24 GiB" \
    "${LIM[@]}" "$BIN" eval compare "$M" --token-ids-file "$T/docs6000.json" --bootstrap 100000
  grep -qF "more than half of the address-space limit (ulimit -v) (3.81 GiB); use at most --bootstrap 85219" "$T/err" ||
    fail "--bootstrap: the memory bound not stated: $(cat "$T/err")"
  grep -qF "compare [" "$T/err" && fail "--bootstrap was checked after the scoring: $(cat "$T/err")"
fi

# --- issue 37 B: optional files that are not files are refused, not skipped ----------
for f in generation_config.json chat_template.jinja; do
  cp -r "$M" "$T/of"; rm -f "$T/of/$f"; mkfifo "$T/of/$f"
  case $f in
    chat_template.jinja) t "$f is a FIFO (serve)" "$T/of/$f: is a FIFO, expected a file" "$BIN" serve "$T/of" --port 0 ;;
    *) t "$f is a FIFO" "$T/of/$f: is a FIFO, expected a file" "$BIN" generate "$T/of" --prompt hi --max-tokens 2 ;;
  esac
  rm -rf "$T/of"; cp -r "$M" "$T/of"; rm -f "$T/of/$f"; mkdir "$T/of/$f"
  case $f in
    chat_template.jinja) t "$f is a directory (serve)" "$T/of/$f: is a directory, expected a file" "$BIN" serve "$T/of" --port 0 ;;
    *) t "$f is a directory" "$T/of/$f: is a directory, expected a file" "$BIN" generate "$T/of" --prompt hi --max-tokens 2 ;;
  esac
  rm -rf "$T/of"
done

# --- issue 37 B: empty and zero values that used to mean "default" --------------------
t "calibrate --max-corpus-tokens 0" "--max-corpus-tokens: must be >= 1 (got 0)" \
  "$BIN" calibrate "$M" --corpus "$T/good.txt" --output "$T/r.json" --max-corpus-tokens 0
t "generate --gpu-memory-utilization 0" "--gpu-memory-utilization: must be in (0, 1], got 0" \
  "$BIN" generate "$M" --prompt hi --gpu-memory-utilization 0
t "generate --kv-memory ''" "--kv-memory: empty value (give a size such as 512MiB, or omit the flag)" "$BIN" generate "$M" --prompt hi --kv-memory ""
t "serve --api-key ''" "--api-key: empty value" "$BIN" serve "$M" --api-key "" --port 0

# --- issue 37 B: messages that name the path kind and the flag ------------------------
t 'tokenize ""' "the tokenizer path is empty" "$BIN" tokenize "" --text hi
ln -s "$T/loop" "$T/loop"
t "model path is a symlink loop" "$T/loop: is a symlink loop" "$BIN" tokenize "$T/loop" --text hi
t "--text-file is a symlink loop" "--text-file $T/loop: is a symlink loop" "$BIN" tokenize "$M" --text-file "$T/loop"
t "capacity on a symlink loop" "$T/loop: is a symlink loop" "$BIN" capacity "$T/loop" --kv-memory 1GiB
t "--text-file is a directory" "--text-file $T: is a directory" "$BIN" tokenize "$M" --text-file "$T"
t "model path is a FIFO" "$T/fifo: is a FIFO" "$BIN" tokenize "$T/fifo" --text hi
t "generate DIR/config.json" "is a model's config.json, not a tokenizer: give the model directory $M" \
  "$BIN" generate "$M/config.json" --prompt hi
t "--max-tokens abc" "error: --max-tokens: 'abc' is not an integer (expected an integer in [-2147483648, 2147483647]; this option: >=1)" \
  "$BIN" generate "$M" --prompt hi --max-tokens abc
t "--max-tokens 99999999999" "error: --max-tokens: 99999999999 is out of range (expected an integer in [-2147483648, 2147483647]" \
  "$BIN" generate "$M" --prompt hi --max-tokens 99999999999
t "--top-p abc" "error: --top-p: 'abc' is not a number" "$BIN" generate "$M" --prompt hi --top-p abc

# --- issue 37 B: invalid UTF-8 is refused naming the flag, everywhere ------------------
X=$(printf 'a\xffb')
printf 'ab\xffcd' > "$T/bad.txt"
printf '{"ids": [1, 2], "note": "a\xffb"}' > "$T/bad_ids.json"
utf8="not valid UTF-8 (first invalid byte 0xFF at byte offset"
t "generate --prompt" "--prompt: $utf8 1)" "$BIN" generate "$M" --prompt "$X" --max-tokens 2
t "tokenize --text" "--text: $utf8 1)" "$BIN" tokenize "$M" --text "$X"
t "eval compare --control-prefix" "--control-prefix: $utf8 1)" "$BIN" eval compare "$M" --text-file "$T/good.txt" --control --control-prefix "$X"
t "serve --served-model-name" "--served-model-name: $utf8 1)" "$BIN" serve "$M" --served-model-name "$X" --port 0
t "bench serve --model" "--model: $utf8 1)" "$BIN" bench serve --model "$X" --port 1
t "tokenize --text-file" "--text-file $T/bad.txt: $utf8 2)" "$BIN" tokenize "$M" --text-file "$T/bad.txt"
t "score --text-file" "--text-file $T/bad.txt: $utf8 2)" "$BIN" score "$M" --text-file "$T/bad.txt" --output "$T/s.json"
t "eval compare --text-file" "--text-file $T/bad.txt: $utf8 2)" "$BIN" eval compare "$M" --text-file "$T/good.txt" --text-file "$T/bad.txt"
t "eval kvstats --text-file" "--text-file $T/bad.txt: $utf8 2)" "$BIN" eval kvstats "$M" --text-file "$T/bad.txt" --scales unity
t "calibrate --corpus" "--corpus $T/bad.txt: $utf8 2)" "$BIN" calibrate "$M" --corpus "$T/bad.txt" --output "$T/r.json"
t "eval niah --haystack" "--haystack $T/bad.txt: $utf8 2)" "$BIN" eval niah "$M" --haystack "$T/bad.txt" --lengths 64 --depths 50 --trials 1
t "score --token-ids-file" "--token-ids-file $T/bad_ids.json: $utf8 26)" "$BIN" score "$M" --token-ids-file "$T/bad_ids.json" --output "$T/s.json"
t "eval compare --token-ids-file" "--token-ids-file $T/bad_ids.json: $utf8 26)" "$BIN" eval compare "$M" --token-ids-file "$T/bad_ids.json"
t "calibrate --corpus-ids-file" "--corpus-ids-file $T/bad_ids.json: $utf8 26)" "$BIN" calibrate "$M" --corpus-ids-file "$T/bad_ids.json" --output "$T/r.json"
t "inject --report" "--report $T/bad_ids.json: $utf8 26)" "$BIN" inject "$M" --report "$T/bad_ids.json" --output "$T/inj_utf8"
printf '{{ "a\xffb" }}' > "$T/bad.jinja"
t "serve --chat-template" "--chat-template $T/bad.jinja: $utf8 5)" "$BIN" serve "$M" --chat-template "$T/bad.jinja" --port 0
cp -r "$M" "$T/mj"; cp "$T/bad.jinja" "$T/mj/chat_template.jinja"
t "serve: chat_template.jinja" "$T/mj/chat_template.jinja: chat template $utf8 5)" "$BIN" serve "$T/mj" --port 0
rm -rf "$T/mj"
# A path that is not UTF-8 is a valid path: the JSON that echoes it gets U+FFFD
# (was: exit 1, the serializer's type_error 316).
ln -s "$M" "$T/m$X"
expect_rc 0 "$BIN" score "$T/m$X" --text-file "$T/good.txt" --output "$T/s.json"
python3 -c "import json, sys; j = json.load(open(sys.argv[1])); assert j['model'].endswith('m\ufffd') or j['model'].endswith('a\ufffdb'), j['model']" "$T/s.json" ||
  fail "score: a non-UTF-8 model path is not U+FFFD in the JSON"
expect_rc 0 "$BIN" capacity "$T/m$X" --kv-memory 1GiB --json
python3 -c "import json, sys; json.load(open(sys.argv[1]))" "$T/out" || fail "capacity --json: not JSON with a non-UTF-8 path"
echo "ok   non-UTF-8 paths: JSON outputs carry U+FFFD"

# --- issue 37 A7: vLLM's spellings ------------------------------------------------------
expect_rc 0 "$BIN" capacity "$M" --kv-memory 1GiB --max-model-len 100 --json; base=$(cat "$T/out")
for v in 0.1k; do expect_rc 0 "$BIN" capacity "$M" --kv-memory 1GiB --max-model-len "$v" --json; done
[ "$(cat "$T/out")" = "$base" ] || fail "--max-model-len 0.1k differs from 100"
t "--max-model-len 32k above the model" "32000" "$BIN" generate "$M" --prompt hi --max-model-len 32k
t "--max-model-len 1.5" "--max-model-len" "$BIN" generate "$M" --prompt hi --max-model-len 1.5
t "--max-model-len 0.0001k" "is not a whole number of tokens" "$BIN" generate "$M" --prompt hi --max-model-len 0.0001k
t "--max-model-len 3G" "is not a whole number of tokens in [1, 2147483647]" "$BIN" generate "$M" --prompt hi --max-model-len 3G
expect_rc 0 "$BIN" generate "$M" --prompt hi --max-tokens 2 -tp 2 --threads 1
expect_rc 0 "$BIN" generate "$M" --prompt hi --max-tokens 2 --dtype auto
expect_rc 0 "$BIN" generate "$M" --prompt hi --max-tokens 2 --dtype bfloat16
t "--dtype float16" "--dtype 'float16': fp8kv runs the checkpoint's dtype; accepted: auto, bfloat16" \
  "$BIN" generate "$M" --prompt hi --dtype float16
echo "ok   --max-model-len 0.1k, -tp 2, --dtype auto|bfloat16"

# --- issue 37 A5: --help shows every option's default ----------------------------------
"$BIN" generate --help > "$T/help" 2>&1
for o in "--max-tokens INT:>=1=128" "--block-size INT=16" "--threads INT=0" "--kv-cache-dtype TEXT=auto"; do
  grep -qF -- "$o" "$T/help" || fail "generate --help lacks '$o': $(grep -- "${o%% *}" "$T/help")"
done
echo "ok   --help shows defaults"

# --- server flags -------------------------------------------------------------------
t "serve --host empty" "--host must not be empty" "$BIN" serve "$M" --host "" --port 0
echo "hostile_inputs: ok"
